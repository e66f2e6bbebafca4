"""The pipeline API: a pipeline's definition (builder, operators, keyed state, validation, chaining into a plan).

It describes a pipeline and never runs it: ``spark_plugin.driver`` runs what it describes, and the task side
runs its operators.
"""
