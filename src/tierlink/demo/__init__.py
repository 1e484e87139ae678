"""The demo: an application of the framework, not a part of it.

``tierlink demo`` starts a 7-node fleet (control plane, 1 cloud, 2 edges, 4 devices,
emulated links, throttled device CPUs), drives a mixed Fashion-MNIST workload and a photo
workload (split plans) through it, and reports tierlink beside the baselines (static rules,
cloud-only, device-only); ``--chat`` adds a chat phase on a fleet of its own.

* :mod:`tierlink.demo.phases`: its settings and what one run does (the workloads, the photo
  phase, the thresholds' prediction, the summaries of the fleet and the machine);
* :mod:`tierlink.demo.run`: the whole demo, its progress and its printed report;
* :mod:`tierlink.demo.chat` and :mod:`tierlink.demo.chat_run`: the chat phase;
* :mod:`tierlink.demo.fleets`: its fleet files, as package data.

Only the command line imports it; it may import anything of the framework.
"""
