"""A local fleet on kernel networking: each node in a network namespace of its own with
its own address (fabric.py), links shaped by the kernel (shaping.py: htb bandwidth,
iptables loss), and a reaper that removes everything if `tierlink up` itself dies
(reaper.py). Needs root and iproute2 / iptables; the user-space link emulator
(tierlink.netem) stays for machines without them."""
