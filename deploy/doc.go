// Package deploy reads the files that build and run the service (the
// Dockerfile, .dockerignore, docker-compose.yml, the Makefile and the
// Kubernetes base in this directory) into typed values, with the parsers
// the tools themselves use where one exists: BuildKit's for the Dockerfile,
// YAML for compose and the manifests.
//
// Only tests import it. Its own tests (the *_test.go files here) hold the
// rules the files keep among themselves and with the release workflow; the
// tests of cmd/munchable-webhooks compare the same files with the service's
// configuration, which only package main can see.
package deploy
