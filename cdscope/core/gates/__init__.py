"""What a gate is and where it multiplies (SPEC §1-2), below model loading (whose proof
installs the real ``WriteSite`` hooks) and below ``cdscope.core.gating`` (which gates a model):

* ``vocabulary``: ``GateUnit`` / ``GateSet`` (the ordered gates of a granularity), the
  ``GateState`` / ``Capture`` the hooks read, the ``GateSite`` protocol, gate shaping;
* ``sites``: the sites (a whole write, ``write_sites``; heads or neurons on a projection's
  input; MoE experts on their routing weights).

Nothing is imported here, so the proof's import of ``sites`` loads no more than it needs.
"""
