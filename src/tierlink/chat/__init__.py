"""Chat and completions on tierlink nodes: the OpenAI API (``openai``: request parsing,
answer and stream shapes, errors), the routes a node installs (``routes``) and the service
that answers them with the node's language models (``service``)."""
