"""Tests of tierlink.client (a package, so the integration helpers import as `integration`)."""
