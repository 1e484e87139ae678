"""Integration tests: real fleet processes on loopback. A package, so that the shared fleet's
``package`` scope ends with these tests instead of lingering through the rest of the suite."""
