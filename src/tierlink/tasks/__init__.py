"""Tasks: what a request carries and what kind of answer it gets (classification,
multilabel, detection, regression, embedding, or a user's own kind)."""
