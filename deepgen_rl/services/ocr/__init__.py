"""OCR reward service: FastAPI app (``app``), pure scoring (``scoring``), request validation, launcher."""
