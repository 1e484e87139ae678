"""Engines that run a node's models somewhere other than its own process: Ray Serve for a
cloud tier that scales its replicas with load (ray_serve.py), and the local Ray cluster
`tierlink up` starts for it (ray_cluster.py). Ray is imported only where it is used."""
