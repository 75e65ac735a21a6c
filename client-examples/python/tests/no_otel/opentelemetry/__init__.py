# Test shim: put this directory first on PYTHONPATH to make `import opentelemetry` fail as if
# the OpenTelemetry packages were not installed (run-e2e.sh uses it to prove the helper works
# unchanged without them).
raise ImportError("opentelemetry is hidden by tests/no_otel")
