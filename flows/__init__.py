"""Gil's Prefect flows: thin, each calls library functions of ``gil_core`` in order. The CLI lives here too,
because ``gil serve`` and ``gil ui`` speak Prefect, and ``gil_core`` never imports it."""
