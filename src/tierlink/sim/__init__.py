"""The fleet simulator: a fleet file and a workload on simulated time, judged before they
meet production.

It runs the nodes' own code — the policies (``tierlink.policy``), the dispatcher's steps
(``node/dispatcher.py``), the scheduler (``node/scheduler.py``), the breakers and the link
estimators — with callbacks on an event loop whose clock is virtual (``loop``, ``dispatch``,
``hop``: no task per simulated request). Only a node's environment
is simulated: a model's run time (``compute``) and answer, read from each model's recorded
answers on the test split (``outcomes``), the wire (``links``), the registry's staleness and
the faults of a scenario (``fleet``, ``build``, ``scenario``), the arrivals (``workload``).
``run`` reports in the demo's schema; ``plots`` draws it over simulated time.
"""
