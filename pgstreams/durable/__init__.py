"""The Durable Streams protocol (HTTP, version 1.0) over pgstreams' streams: ``wire`` (the
protocol's vocabulary, pure), ``store`` (its database work) and ``views`` (the endpoint)."""
