"""The terminal faces: the `runner` command, the chat REPL and the one-file executable's front end."""
