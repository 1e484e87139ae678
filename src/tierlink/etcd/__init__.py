"""etcd: a client over its JSON gateway (:mod:`tierlink.etcd.client`) and a local cluster
of real members (:mod:`tierlink.etcd.cluster`)."""
