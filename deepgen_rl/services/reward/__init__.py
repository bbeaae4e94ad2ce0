"""One reward server for every registered reward (``python -m deepgen_rl.services.reward --reward NAME``):
FastAPI app (``app``), request validation, scoring pool (micro-batching, replicas), hardened uvicorn protocol."""
