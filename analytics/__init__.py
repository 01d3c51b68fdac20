"""PySpark analytics over the twin's event audit trail (TWIN_EVENTS).

`mavjet.analytics.source` is the `jetstream` Spark data source, `mavjet.analytics.jobs` the
replay jobs as pure DataFrame -> DataFrame functions, `mavjet.analytics.replay` the
`mavjet replay` command. Importing this package does not import pyspark.
"""
