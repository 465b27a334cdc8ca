"""The real executor: input batch, attention metadata and backends, model forward and sampling."""
