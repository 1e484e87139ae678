"""tierlink.cascade: choosing where a cascade stops, for a stated target.

A cascade runs the cheapest model first and escalates an input to the next tier when the
model's calibrated confidence is below that tier's threshold. :mod:`tierlink.cascade.tune`
(pure numpy) evaluates and tunes thresholds on per-stage confidence/correctness arrays;
:mod:`tierlink.cascade.stages` builds those arrays from zoo models on a dataset split;
:mod:`tierlink.fleet.fleetfile` writes tuned thresholds into a fleet YAML file.
"""
