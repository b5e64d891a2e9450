"""Gating a model (SPEC §1-2) with the gates of ``cdscope.core.gates``, by granularity:

* ``units``: finding the projection and expert modules, ``SITE_BUILDERS`` (granularity ->
  its sites);
* ``model``: ``GatedModel``, the hooks of one granularity and their lifecycle;
* ``edge``: the edge gate set (EAP's graph, measured by ``cdscope.core.edge_control``);
Every --granularity by name, edge included: ``cdscope.core.granularities``.

The granularity names are ``cdscope.settings.names``'. Nothing is imported here.
"""
