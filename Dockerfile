# syntax=docker/dockerfile:1
# The one image of a msgtrail deployment: the `msgtrail` binary (broker, listener, CLI),
# built without the development commands `dev` and `bench` (--no-default-features).
# Built from the repository root: `docker build -t msgtrail .` (deploy/docker-compose.yml
# does it for you).

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and target dir between builds; the binary is copied out
# of the cached target dir because cache mounts are not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p msgtrail-cli --no-default-features \
 && cp target/release/msgtrail /usr/local/bin/msgtrail

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/msgtrail /usr/local/bin/msgtrail
# The listener's embedded store lives here (a volume in docker-compose.yml).
RUN mkdir -p /var/lib/msgtrail && chown 65532:65532 /var/lib/msgtrail
USER 65532:65532
ENTRYPOINT ["msgtrail"]
CMD ["--help"]
