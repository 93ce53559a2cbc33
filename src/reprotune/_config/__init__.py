"""The experiment config: schema (``schema``), YAML with line marks (``yaml_io``), loading with
``--set`` and all-errors-at-once (``loading``), the generated key reference (``reference``)."""
