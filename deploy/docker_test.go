package deploy_test

// The rules the Dockerfile and .dockerignore keep with the Makefile and
// the Go build; cmd/munchable-webhooks/deploy_test.go compares the port
// with the configuration.

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/munchable/munchable-webhooks/deploy"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// root is the repository, seen from this package's directory.
const root = ".."

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func dockerfile(t *testing.T) deploy.Dockerfile {
	t.Helper()
	d, err := deploy.ReadDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func goBuild(t *testing.T, d deploy.Dockerfile) deploy.GoBuild {
	t.Helper()
	b, err := d.GoBuild()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// index is the position of the first instruction in stage that is cmd
// with args, or -1.
func index(stage []deploy.Instruction, cmd string, args ...string) int {
	return slices.IndexFunc(stage, func(in deploy.Instruction) bool {
		return in.Cmd == cmd && slices.Equal(in.Args, args)
	})
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	d := dockerfile(t)
	b := goBuild(t, d)

	t.Run("go build is make build", func(t *testing.T) {
		// Make writes $(VERSION), the Dockerfile ${VERSION}.
		got := make([]string, len(b.Flags))
		for i, f := range b.Flags {
			got[i] = strings.NewReplacer("${VERSION}", "$(VERSION)", "${COMMIT}", "$(COMMIT)").Replace(f)
		}
		want, err := deploy.MakefileBuildFlags(root)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Dockerfile's go build flags differ from the Makefile's BUILD_FLAGS (-make +docker):\n%s", diff)
		}
		if !slices.Contains(b.Env, "CGO_ENABLED=0") {
			t.Errorf("go build runs with %v, want CGO_ENABLED=0 (a static binary for distroless static)", b.Env)
		}
		if b.Package != "./cmd/munchable-webhooks" {
			t.Errorf("Dockerfile builds %s", b.Package)
		}
		if !strings.Contains(readFile(t, "Makefile"), "CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN) "+b.Package) {
			t.Error("Makefile's build target no longer builds the Dockerfile's package with CGO_ENABLED=0 and BUILD_FLAGS")
		}
	})

	t.Run("VERSION and COMMIT are build arguments", func(t *testing.T) {
		// The release workflow passes the tag as --build-arg VERSION, the
		// commit as COMMIT.
		build := d.Stages[0]
		run := slices.IndexFunc(build, func(in deploy.Instruction) bool {
			return in.Cmd == "RUN" && strings.Contains(strings.Join(in.Args, " "), "go build")
		})
		for arg, variable := range map[string]string{"VERSION": "version", "COMMIT": "commit"} {
			i := slices.IndexFunc(build, func(in deploy.Instruction) bool {
				return in.Cmd == "ARG" && len(in.Args) == 1 && strings.HasPrefix(in.Args[0], arg)
			})
			flag := "main." + variable + "=${" + arg + "}"
			if i < 0 || i > run || !slices.ContainsFunc(b.Flags, func(f string) bool { return strings.Contains(f, flag) }) {
				t.Errorf("build stage: want ARG %s before go build, and -X %s (at %d, %d; flags %v)", arg, flag, i, run, b.Flags)
			}
		}
	})

	t.Run("modules come in their own layer, before the source", func(t *testing.T) {
		build := d.Stages[0]
		mods, download, source := index(build, "COPY", "go.mod", "go.sum", "./"), index(build, "RUN", "go mod download"), index(build, "COPY", ".", ".")
		if mods < 0 || download < 0 || source < 0 || !(mods < download && download < source) {
			t.Errorf("build stage: want COPY go.mod go.sum ./, RUN go mod download, then COPY . . (at %d, %d, %d)", mods, download, source)
		}
	})

	t.Run("base images are pinned by digest", func(t *testing.T) {
		pinned := regexp.MustCompile(`^[a-z0-9./-]+:[a-z0-9.-]+@sha256:[0-9a-f]{64}$`)
		for i, stage := range d.Stages {
			if image := stage[0].Args[0]; !pinned.MatchString(image) {
				t.Errorf("stage %d is FROM %s, want name:tag@sha256:digest (a tag moves; a release must rebuild the same image)", i, image)
			}
		}
	})

	t.Run("the image is the binary on distroless static, as nonroot", func(t *testing.T) {
		want := map[string][]string{
			"FROM":        {"gcr.io/distroless/static-debian12:nonroot"},
			"COPY":        {"--from=build " + b.Output + " /munchable-webhooks"},
			"USER":        {"nonroot:nonroot"},
			"EXPOSE":      {"one port"}, // cmd/munchable-webhooks/deploy_test.go checks which
			"HEALTHCHECK": {`["CMD" "/munchable-webhooks" "healthcheck"]`},
			"ENTRYPOINT":  {`["/munchable-webhooks"]`},
			"CMD":         {`["serve"]`},
		}
		have := map[string][]string{}
		for _, in := range d.Final() {
			have[in.Cmd] = append(have[in.Cmd], finalArgs(in))
		}
		if diff := cmp.Diff(want, have); diff != "" {
			t.Errorf("final stage (-want +got):\n%s", diff)
		}
	})
}

// finalArgs is how the final stage's check reads an instruction: FROM
// without its digest, EXPOSE as "one port", the exec form (no shell in the
// image) as a quoted list without HEALTHCHECK's options, which are tuning,
// and anything else as its flags and arguments.
func finalArgs(in deploy.Instruction) string {
	switch {
	case in.Cmd == "FROM":
		image, _, _ := strings.Cut(in.Args[0], "@")
		return image
	case in.Cmd == "EXPOSE" && len(in.Args) == 1:
		return "one port"
	case in.JSON:
		return jsonArray(in.Args)
	}
	return strings.Join(slices.Concat(in.Flags, in.Args), " ")
}

// jsonArray writes args as the Dockerfile's exec form reads, quoted.
func jsonArray(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// The context holds every file the build reads: a new embedded directory
// outside the allow-list would otherwise break only the image build. The
// rules are read and matched by the library Docker's own builder uses.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(rules)
	if err != nil {
		t.Fatal(err)
	}
	included := func(p string) bool {
		excluded, err := pm.MatchesOrParentMatches(p)
		if err != nil {
			t.Fatal(err)
		}
		return !excluded
	}
	needed := buildInputs(t)
	if len(needed) < 10 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, f := range needed {
		if !included(f) {
			t.Errorf(".dockerignore leaves out %s, which the build reads", f)
		}
	}
	for _, f := range []string{".git/HEAD", ".dev/postgres.log", "cmd/munchable-webhooks/deploy_test.go", "docker-compose.yml", "deploy/kube.go"} {
		if included(f) {
			t.Errorf(".dockerignore lets %s into the build context", f)
		}
	}
}

// buildInputs are the files `go build ./cmd/munchable-webhooks` reads from
// the module: go.mod, go.sum, and the Go and embedded files of every
// package of the module it imports.
func buildInputs(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", "./cmd/munchable-webhooks")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var pkg struct {
			Dir                 string
			GoFiles, EmbedFiles []string
			Module              *struct{ Main bool }
		}
		if err := dec.Decode(&pkg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if pkg.Module == nil || !pkg.Module.Main {
			continue
		}
		rel, err := filepath.Rel(abs, pkg.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Concat(pkg.GoFiles, pkg.EmbedFiles) {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	return needed
}

// Builds the binary exactly as the Dockerfile does (without the Makefile),
// and runs it the way the image does.
func TestDockerBuildFlagsMakeARunnableStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	b := goBuild(t, dockerfile(t))
	const version, commit = "deploy-test-1.2.3", "deploy-test-commit"
	args := []string{"build"}
	for _, f := range b.Flags {
		args = append(args, strings.NewReplacer("${VERSION}", version, "${COMMIT}", commit).Replace(f))
	}
	bin := filepath.Join(t.TempDir(), "munchable-webhooks")
	args = append(args, "-o", bin, b.Package)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if info, err := os.Stat(bin); err == nil {
		t.Logf("binary: %d bytes (%.1f MiB)", info.Size(), float64(info.Size())/(1<<20))
	}

	t.Run("version prints the build's VERSION", func(t *testing.T) {
		out, err := exec.Command(bin, "version").Output()
		lines := strings.Split(string(out), "\n")
		if err != nil || len(lines) < 2 || lines[0] != "version: "+version || lines[1] != "commit: "+commit {
			t.Errorf("%s version = %q, %v; want lines %q and %q", bin, out, err, "version: "+version, "commit: "+commit)
		}
	})
	t.Run("static: distroless static has no dynamic loader", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skip("reads an ELF binary")
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("the binary is dynamically linked (has PT_INTERP)")
			}
		}
	})
	t.Run("the image's HEALTHCHECK", func(t *testing.T) {
		checkHealthcheck(t, bin)
	})
}

// checkHealthcheck runs `bin healthcheck` as the image does: exit 0 for a
// serving process, non-zero when nothing answers, within its 2 s timeout.
func checkHealthcheck(t *testing.T, bin string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || r.Method != http.MethodGet {
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	_, healthy, _ := net.SplitHostPort(srv.Listener.Addr().String())
	free, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		port   string
		wantOK bool
	}{{healthy, true}, {strconv.Itoa(free), false}} {
		hc := exec.Command(bin, "healthcheck")
		hc.Env = []string{"LISTEN_ADDR=:" + tt.port}
		start := time.Now()
		err := hc.Run()
		if (err == nil) != tt.wantOK {
			t.Errorf("healthcheck against port %s: %v, want ok=%v", tt.port, err, tt.wantOK)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("healthcheck took %s, want under its 2s timeout", time.Since(start))
		}
	}
}
