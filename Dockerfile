# syntax=docker/dockerfile:1

# Base images are pinned by the digest of their multi-arch index, so that a
# release tag always rebuilds the same image; the tag beside each digest
# says what it is. To move to a newer one, take the index digest of the tag
# and test the build:
#   docker buildx imagetools inspect golang:1.26.8-bookworm --format '{{.Manifest.Digest}}'
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot --format '{{.Manifest.Digest}}'

# Build stage: the Go toolchain of go.mod's go line. It runs on the builder's
# own platform and cross-compiles (the binary is pure Go), so a multi-arch
# image needs no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm@sha256:9fdc884aacc3bec89b20ffc69f4bb369c78210e3e4f600387b5128b12c199f81 AS build
WORKDIR /src

# Modules in a layer of their own, rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
# The version `munchable-webhooks version` prints: the release workflow
# passes the git tag (--build-arg VERSION=v1.2.3), as make build passes git
# describe.
ARG VERSION=dev
# The commit it prints (--build-arg COMMIT=<sha>; the context has no .git).
ARG COMMIT=
ARG TARGETOS
ARG TARGETARCH
# The flags are the Makefile's BUILD_FLAGS (deploy/docker_test.go holds the
# two together). CGO_ENABLED=0 makes a static binary, which is what
# the distroless static image can run.
RUN --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/munchable-webhooks ./cmd/munchable-webhooks

# Final stage: the binary alone, on distroless static (CA certificates, tzdata,
# /etc/passwd with nonroot; no shell, no package manager).
FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
COPY --from=build /out/munchable-webhooks /munchable-webhooks
USER nonroot:nonroot
EXPOSE 8080
# No shell or curl in the image: the binary checks its own /healthz on the
# LISTEN_ADDR port. (Kubernetes ignores this and uses its own probes.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 CMD ["/munchable-webhooks", "healthcheck"]
ENTRYPOINT ["/munchable-webhooks"]
CMD ["serve"]
