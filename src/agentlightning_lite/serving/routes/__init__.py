"""The PolicyServer's route families, one module each: ``calls`` (what every generation route shares),
``chat`` (``/v1/chat/completions``), ``completions`` (``/v1/completions``), ``meta`` (``/v1/models``,
``/health``)."""
