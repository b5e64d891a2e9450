"""GRPO post-training with the CD-RFT regulariser (SPEC §5).

* ``config``     -- TrainConfig (SPEC §5 reference defaults) and presets
* ``grpo``       -- group advantages, completion log-probs, clipped loss + k3 KL
* ``cdrft``      -- probe measurement, regulariser gradient step, projection loop
* ``checkpoint`` -- complete-or-absent checkpoints with a ``latest`` pointer
* ``loop``       -- the training loop and its per-step Parquet log

See docs/train.md.
"""
