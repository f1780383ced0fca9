"""llama.cpp under the engine: the one llama_cpp importer (llama.py), the model runner, batch
splitting, load-time measurements, GGUF headers and the memory plan."""
