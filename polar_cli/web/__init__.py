"""The web layer every HTTP server Polar starts shares (the proxy, a gateway node, the rollout server, the doctor's
proxy), one module per concept:

- :mod:`~polar_cli.web.errors`: JSON replies, the control error shape, ``status_for(exc)``, the ``json_errors``
  middleware and ``ERROR_SHAPE`` (an app's error shape per path);
- :mod:`~polar_cli.web.auth`: control tokens (generation, ``resolve_token``) and the constant-time bearer guard;
- :mod:`~polar_cli.web.body`: the one request-body reader and its limits (size, ``Content-Encoding``, JSON nesting);
- :mod:`~polar_cli.web.disconnect`: ``client_gone(request)``, an event set the moment the client hangs up;
- :mod:`~polar_cli.web.parser_errors`: ``app_runner``, whose HTTP-parser errors are answered in the app's shape
  (the one module on aiohttp's private API);
- :mod:`~polar_cli.web.listen`: ``listen(app, host, port)``, bind and serve with all of the above, and ``listen_url``;
- :mod:`~polar_cli.web.metrics`: the ``GET /metrics`` handler (Prometheus text) and ``listen_metrics``, the separate
  metrics bind.
"""
