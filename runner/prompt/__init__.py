"""The prompt: chat templates and the tool-call syntaxes they speak."""
