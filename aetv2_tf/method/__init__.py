"""The method: homographies and SO(3) (`geometry`, `polar`), the AETv2 and AETv1 losses and
metrics (`losses`, `metrics`), the optimizers (`optimizers`) and the pretraining recipes that
combine them (`recipes`, built from `recipe_parts`). Mathematics only: nothing here reads or
writes a file."""
