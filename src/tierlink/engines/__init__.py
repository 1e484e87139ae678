"""A local Ray cluster for a fleet's ``engine: ray`` nodes (ray_cluster.py): started and
stopped by its process group. The nodes' side — Ray Serve deployments behind a node's front
door — is tierlink.node.ray_serve. Ray is imported only where it is used."""
