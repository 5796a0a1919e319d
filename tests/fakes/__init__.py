"""Stand-ins for what cannot be reached from a test: loopback servers and emulators, never imported by runtime
code. ``gcs`` (the fake-gcs-server helper and a fault-injecting proxy), ``vertex`` (a recording Vertex AI
REST endpoint and the emulation of how Vertex runs a compiled pipeline's tasks), ``google_apis`` (IAM,
Resource Manager, Cloud Quotas), ``webhook_receiver`` (a notification webhook)."""
