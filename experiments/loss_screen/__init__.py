"""The loss screen: which AETv2 loss sees the whole homography (experiments/README.md)."""
