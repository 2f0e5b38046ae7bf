# The promptjobs image: one image, two roles. `docker run IMAGE api` or `... worker`; every
# setting is a PROMPTJOBS_* environment variable (docs/configuration.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The project's metadata first, so a code change does not reinstall the dependencies.
COPY pyproject.toml README.md ./
RUN mkdir promptjobs workflows activities api projections services \
    && pip install . \
    && pip uninstall --yes promptjobs

COPY promptjobs ./promptjobs
COPY workflows ./workflows
COPY activities ./activities
COPY api ./api
COPY projections ./projections
COPY services ./services
RUN pip install --no-deps .

RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin promptjobs \
    && mkdir /app/.data && chown promptjobs /app/.data
USER promptjobs

# In a container the API listens on every interface; the port is PROMPTJOBS_API_PORT.
ENV PROMPTJOBS_API_HOST=0.0.0.0
EXPOSE 8000

# Exec form: promptjobs is PID 1 and receives SIGTERM itself, so `docker stop` drains it.
ENTRYPOINT ["promptjobs"]
CMD ["api"]
