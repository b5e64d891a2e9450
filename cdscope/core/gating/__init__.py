"""The gates (SPEC §1-2): what a gate is and where it multiplies, by granularity.

* ``vocabulary``: ``GateUnit`` / ``GateSet`` (the ordered gates of a granularity), the
  ``GateState`` / ``Capture`` the hooks read, the ``GateSite`` protocol, gate shaping;
* ``sites``: the sites (a whole write; heads or neurons on a projection's input; MoE experts
  on their routing weights);
* ``units``: finding the projection and expert modules, ``SITE_BUILDERS`` (granularity ->
  its sites);
* ``model``: ``GatedModel``, the hooks of one granularity and their lifecycle;
* ``edge``: the edge gate set (EAP's graph, measured by ``cdscope.core.edge_control``);
* ``registry``: ``gates_for`` -- every --granularity by name, edge included.

The granularity names are ``cdscope.settings.names``'. ``vocabulary``, ``sites`` and
``units`` sit with model loading (its proof installs the real ``WriteSite`` hooks); the rest
sits with ``cdscope.core``. Nothing is imported here, so the proof's import of ``sites``
loads no more than it needs.
"""
