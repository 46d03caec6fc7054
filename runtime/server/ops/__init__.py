"""What an operator looks at: ``/metrics``, the live dashboard and its data, running
programs, and the ops routes."""
