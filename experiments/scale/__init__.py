"""The encoders at scale on a lent GPU (experiments/README.md); their runs: results/scale."""
