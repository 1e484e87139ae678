"""Capacity and cost planning: an inventory of use cases and a hardware catalogue
(``inventory``) -> a placement per use case sized on P95 with headroom, monthly cost per
tier, training runs by 6·N·D (``planner``), beside all-cloud and all-edge plans."""
