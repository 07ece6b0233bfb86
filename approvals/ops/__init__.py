"""Operating the app: health (/healthz, /readyz) and Prometheus metrics (/metrics), mounted by
`approvals.ops_urls` (docs/operations.md, "Health and metrics")."""
