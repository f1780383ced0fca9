"""A model made ready to serve: file, memory plan, engine, and what the faces may ask of it."""
