"""Experiments of the project: the scripts of one study each, beside their results in results/."""
