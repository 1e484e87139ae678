"""The fleet's security: its certificate authority (pki.py), the identity names callers
verify (names.py), TLS contexts that reload their certificate in place (tls.py), who sent a request as the TLS layer saw it (asgi_tls.py),
and what an authenticated sender may claim about a request (claims.py, pure)."""
