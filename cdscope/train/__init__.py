"""GRPO post-training with the CD-RFT regulariser (SPEC §5).

* ``grpo``       -- group advantages, completion log-probs, clipped loss + k3 KL
* ``cdrft``      -- probe measurement, regulariser gradient step, projection loop
* ``step``       -- ``CDRFTStep``: the CD-RFT part of one optimizer step (carried
                    measurement, finite checks, DDP sync, log columns), driven by both
                    backends
* ``run``        -- what both backends share: run inputs / result, rewards, reward
                    columns, the final-model folder
* ``checkpoint`` -- complete-or-absent checkpoints with a ``latest`` pointer
* ``loop``       -- the hf training loop and its per-step Parquet log
  (the TRL backend is ``cdscope.integrations.trl``)

The run's settings, TrainConfig, live with every command's in ``cdscope.settings.training``.
See docs/train.md.
"""
