"""The paper's CIFAR-10 experiment (1,500 epochs on all 50,000 images) carried across lent GPUs.

* `pack`: the 50,000 training images as JPEG mosaics small enough to travel to a device machine
  beside the repository (and back into the official python layout there);
* `leg`: one leg on a device machine: restore each campaign run, train until a deadline, return
  its newest checkpoint;
* `land`: back here: check what a leg returned, put it into results/campaign/, add the ledger row;
* `prepare`: before a leg, here: the luggage checked and counted as the device tool counts it
  (`luggage`), the device call printed.

results/campaign/LEDGER.md has every leg; docs/campaign.md says how to run one.
"""
