"""How nodes behave, as a fleet file (or a node's spec) says: the ``routing:``, ``cost:`` and
``hard_examples:`` sections, validated once and frozen. Shared by the launcher (``fleet/``)
and the nodes (``node/``), so neither reads its configuration from the other's package."""
