"""The OpenAI API routes: ``/v1/completions``, ``/v1/chat/completions`` and what they share."""
