"""PySpark analytics over the twin's event audit trail (TWIN_EVENTS).

`analytics.source` is the `jetstream` Spark data source, `analytics.jobs` the
replay jobs as pure DataFrame -> DataFrame functions, `analytics.replay` the
`mavjet replay` command. Importing this package does not import pyspark.
"""
