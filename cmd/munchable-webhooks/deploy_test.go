package main

// Checks of the deploy files (Dockerfile, .dockerignore, docker-compose.yml,
// deploy/) against the code: no Docker engine or cluster is needed, and a
// renamed variable, a moved port or a changed build flag fails here, not in
// production.

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

const repoRoot = "../.."

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// --- what the code says ---

// envNames returns the env tags of T's fields, those of embedded
// structs (ClaimConfig) included.
func envNames[T any]() map[string]bool {
	names := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[T]()) {
		if n := f.Tag.Get("env"); n != "" {
			names[n] = true
		}
	}
	return names
}

// secretNames returns the variables T holds as secrets: they must never be
// set from a ConfigMap or a literal in a manifest.
func secretNames[T any]() map[string]bool {
	names := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[T]()) {
		if f.Type == reflect.TypeFor[secret]() {
			names[f.Tag.Get("env")] = true
		}
	}
	return names
}

// requiredNames returns the variables whose absence validate reports as
// "X is required", by validating an empty environment.
func requiredNames(t *testing.T, load func([]string) error) []string {
	t.Helper()
	err := load(nil)
	if err == nil {
		t.Fatal("an empty environment is valid: nothing is required?")
	}
	var names []string
	for line := range strings.SplitSeq(err.Error(), "\n") {
		if name, _, ok := strings.Cut(line, " is required"); ok && !strings.Contains(name, " ") {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no \"X is required\" line in %q", err)
	}
	return names
}

func requiredServeVars(t *testing.T) []string {
	return requiredNames(t, func(env []string) error { _, err := loadConfig(env); return err })
}

func listenPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("LISTEN_ADDR %q: %v", addr, err)
	}
	return port
}

// defaultListenPort is the port of LISTEN_ADDR's default.
func defaultListenPort(t *testing.T) string {
	t.Helper()
	cfg, err := loadConfig(environ(validEnv()))
	if err != nil {
		t.Fatal(err)
	}
	return listenPort(t, cfg.ListenAddr)
}

// --- Dockerfile ---

type instruction struct{ cmd, args string }

// parseDockerfile returns the instructions of each stage, with continuation
// lines joined and comments dropped.
func parseDockerfile(t *testing.T) [][]instruction {
	t.Helper()
	var stages [][]instruction
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(readRepoFile(t, "Dockerfile")))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %s before FROM", in.cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

// shellFields splits a command line into words as sh would for the plain
// quoting used in these files (no escapes, no expansions).
func shellFields(s string) []string {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case unicode.IsSpace(r):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// dockerGoBuild is the Dockerfile's go build command.
type dockerGoBuild struct {
	env    []string // assignments before "go build"
	flags  []string // between "build" and "-o"
	output string
	pkg    string
}

func parseDockerGoBuild(t *testing.T, stages [][]instruction) dockerGoBuild {
	t.Helper()
	var found []dockerGoBuild
	for _, stage := range stages {
		for _, in := range stage {
			if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
				continue
			}
			f := shellFields(in.args)
			i := slices.Index(f, "go")
			o := slices.Index(f, "-o")
			if i < 0 || i+1 >= len(f) || f[i+1] != "build" || o < i || o+2 >= len(f) {
				t.Fatalf("Dockerfile: cannot read the go build line %q", in.args)
			}
			var b dockerGoBuild
			for _, w := range f[:i] {
				if strings.Contains(w, "=") && !strings.HasPrefix(w, "--") {
					b.env = append(b.env, w)
				}
			}
			b.flags, b.output, b.pkg = f[i+2:o], f[o+1], f[o+2]
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("Dockerfile has %d go build lines, want 1", len(found))
	}
	return found[0]
}

// makefileBuildFlags returns the words of the Makefile's BUILD_FLAGS.
func makefileBuildFlags(t *testing.T) []string {
	t.Helper()
	for line := range strings.SplitSeq(readRepoFile(t, "Makefile"), "\n") {
		if v, ok := strings.CutPrefix(line, "BUILD_FLAGS :="); ok {
			return shellFields(v)
		}
	}
	t.Fatal("Makefile has no BUILD_FLAGS := line")
	return nil
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	stages := parseDockerfile(t)
	b := parseDockerGoBuild(t, stages)

	// The same flags as `make build`; Make writes $(VERSION), the Dockerfile
	// ${VERSION}.
	got := make([]string, len(b.flags))
	for i, f := range b.flags {
		got[i] = strings.ReplaceAll(f, "${VERSION}", "$(VERSION)")
	}
	if diff := cmp.Diff(makefileBuildFlags(t), got); diff != "" {
		t.Errorf("Dockerfile's go build flags differ from the Makefile's BUILD_FLAGS (-make +docker):\n%s", diff)
	}
	if !slices.Contains(b.env, "CGO_ENABLED=0") {
		t.Errorf("go build runs with %v, want CGO_ENABLED=0 (a static binary for distroless static)", b.env)
	}
	if b.pkg != "./cmd/munchable-webhooks" {
		t.Errorf("Dockerfile builds %s", b.pkg)
	}
	if !strings.Contains(readRepoFile(t, "Makefile"), "CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN) "+b.pkg) {
		t.Error("Makefile's build target no longer builds the Dockerfile's package with CGO_ENABLED=0 and BUILD_FLAGS")
	}

	// Modules come in their own layer, before the source.
	build := stages[0]
	idx := func(cmd, args string) int {
		return slices.IndexFunc(build, func(in instruction) bool { return in.cmd == cmd && in.args == args })
	}
	mods, download, source := idx("COPY", "go.mod go.sum ./"), idx("RUN", "go mod download"), idx("COPY", ". .")
	if mods < 0 || download < 0 || source < 0 || !(mods < download && download < source) {
		t.Errorf("build stage: want COPY go.mod go.sum ./, RUN go mod download, then COPY . . (at %d, %d, %d)", mods, download, source)
	}

	final := stages[len(stages)-1]
	want := map[string][]string{
		"FROM":        {"gcr.io/distroless/static-debian12:nonroot"},
		"COPY":        {"--from=build " + b.output + " /munchable-webhooks"},
		"USER":        {"nonroot:nonroot"},
		"EXPOSE":      {defaultListenPort(t)},
		"HEALTHCHECK": {`CMD ["/munchable-webhooks", "healthcheck"]`},
		"ENTRYPOINT":  {`["/munchable-webhooks"]`},
		"CMD":         {`["serve"]`},
	}
	have := map[string][]string{}
	for _, in := range final {
		args := in.args
		if in.cmd == "HEALTHCHECK" {
			// Options before CMD are tuning, not what is checked.
			args = args[strings.Index(args, "CMD "):]
		}
		have[in.cmd] = append(have[in.cmd], args)
	}
	if diff := cmp.Diff(want, have); diff != "" {
		t.Errorf("final stage (-want +got):\n%s", diff)
	}
}

// The context holds every file the build reads: a new embedded directory
// outside the allow-list would otherwise break only the image build.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	t.Parallel()
	var rules []string
	for line := range strings.SplitSeq(readRepoFile(t, ".dockerignore"), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			rules = append(rules, line)
		}
	}
	included := func(p string) bool {
		in := true
		for _, r := range rules {
			pattern, keep := strings.CutPrefix(r, "!")
			if dockerignoreMatch(pattern, p) {
				in = keep
			}
		}
		return in
	}

	cmd := exec.Command("go", "list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", "./cmd/munchable-webhooks")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
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
		rel, err := filepath.Rel(root, pkg.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Concat(pkg.GoFiles, pkg.EmbedFiles) {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if len(needed) < 10 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, f := range needed {
		if !included(f) {
			t.Errorf(".dockerignore leaves out %s, which the build reads", f)
		}
	}
	for _, f := range []string{".git/HEAD", ".dev/postgres.log", "cmd/munchable-webhooks/deploy_test.go", "docker-compose.yml"} {
		if included(f) {
			t.Errorf(".dockerignore lets %s into the build context", f)
		}
	}
}

// dockerignoreMatch reports whether a .dockerignore pattern matches p or a
// directory above it (excluding a directory excludes its contents), with
// "**/" matching any number of directories.
func dockerignoreMatch(pattern, p string) bool {
	for q := p; q != "." && q != "/"; q = path.Dir(q) {
		if rest, ok := strings.CutPrefix(pattern, "**/"); ok {
			parts := strings.Split(q, "/")
			for i := range parts {
				if m, _ := path.Match(rest, strings.Join(parts[i:], "/")); m {
					return true
				}
			}
		} else if m, _ := path.Match(pattern, q); m {
			return true
		}
	}
	return false
}

// Builds the binary exactly as the Dockerfile does (without the Makefile),
// and runs it the way the image does.
func TestDockerBuildFlagsMakeARunnableStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	b := parseDockerGoBuild(t, parseDockerfile(t))
	const version = "deploy-test-1.2.3"
	args := []string{"build"}
	for _, f := range b.flags {
		args = append(args, strings.ReplaceAll(f, "${VERSION}", version))
	}
	bin := filepath.Join(t.TempDir(), "munchable-webhooks")
	args = append(args, "-o", bin, b.pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	info, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("binary: %d bytes (%.1f MiB)", info.Size(), float64(info.Size())/(1<<20))

	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != version {
		t.Errorf("%s version = %q, %v; want %q", bin, out, err, version)
	}

	if runtime.GOOS == "linux" {
		// distroless static has no dynamic loader.
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
	}

	// The image's HEALTHCHECK: exit 0 for a serving process, non-zero when
	// nothing answers.
	healthy, _ := healthzServer(t, 200)
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

// --- docker-compose.yml ---

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

func TestDockerCompose(t *testing.T) {
	t.Parallel()
	var c composeFile
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "docker-compose.yml")), &c); err != nil {
		t.Fatal(err)
	}
	pg, rd, svc := c.Services["postgres"], c.Services["redis"], c.Services["webhooks"]

	if pg.Image != "postgres:15" || !slices.Contains(pg.Healthcheck.Test, "pg_isready") {
		t.Errorf("postgres: image %q, healthcheck %v; want postgres:15 checked with pg_isready", pg.Image, pg.Healthcheck.Test)
	}
	if rd.Image != "redis:7" || !cmp.Equal(rd.Healthcheck.Test, []string{"CMD", "redis-cli", "ping"}) {
		t.Errorf("redis: image %q, healthcheck %v; want redis:7 checked with redis-cli ping", rd.Image, rd.Healthcheck.Test)
	}
	if i := slices.Index(rd.Command, "--maxmemory-policy"); i < 0 || i+1 >= len(rd.Command) || rd.Command[i+1] != "noeviction" {
		t.Errorf("redis command %v, want --maxmemory-policy noeviction", rd.Command)
	}

	if svc.Build.Context != "." || svc.Build.Dockerfile != "Dockerfile" {
		t.Errorf("service build = %+v, want the Dockerfile", svc.Build)
	}
	for _, dep := range []string{"postgres", "redis"} {
		if svc.DependsOn[dep].Condition != "service_healthy" {
			t.Errorf("service depends_on %s: %+v, want condition service_healthy", dep, svc.DependsOn[dep])
		}
	}

	env := svc.Environment
	known := envNames[config]()
	for name := range env {
		if !known[name] {
			t.Errorf("environment sets %s, which config.go does not read", name)
		}
	}
	for _, name := range requiredServeVars(t) {
		if env[name] == "" {
			t.Errorf("environment lacks %s, which the service requires", name)
		}
	}
	var vars []string
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	cfg, err := loadConfig(vars)
	if err != nil {
		t.Fatalf("the service's environment does not load:\n%v", err)
	}

	// The credentials are dev-only and look it: the secrets themselves, and
	// the passwords in URLs.
	for name := range secretNames[config]() {
		v := env[name]
		if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
			v, _ = u.User.Password()
		}
		if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v, "whsec_")); err == nil && strings.HasPrefix(v, "whsec_") {
			v = string(raw)
		}
		if v != "" && !strings.Contains(v, "dev") {
			t.Errorf("%s does not look like a dev-only value", name)
		}
	}

	// The service reaches the other two under their service names, with the
	// credentials postgres was started with.
	db, err := url.Parse(env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := db.User.Password()
	gotDB := []string{db.Hostname(), db.User.Username(), pw, strings.TrimPrefix(db.Path, "/")}
	if want := []string{"postgres", pg.Environment["POSTGRES_USER"], pg.Environment["POSTGRES_PASSWORD"], pg.Environment["POSTGRES_DB"]}; !cmp.Equal(gotDB, want) {
		t.Errorf("DATABASE_URL host, user, password, db = %v; postgres service has %v", gotDB, want)
	}
	if r, err := url.Parse(env["REDIS_URL"]); err != nil || r.Hostname() != "redis" {
		t.Errorf("REDIS_URL = %q, want the redis service", env["REDIS_URL"])
	}

	// Published port, listen port and healthcheck port are one port.
	port := listenPort(t, cfg.ListenAddr)
	if len(svc.Ports) != 1 {
		t.Fatalf("service publishes %v, want one port", svc.Ports)
	}
	published := svc.Ports[0]
	containerPort := strings.TrimSuffix(published[strings.LastIndex(published, ":")+1:], "/tcp")
	if containerPort != port {
		t.Errorf("published container port %s, LISTEN_ADDR port %s", containerPort, port)
	}
	if want := []string{"CMD", "/munchable-webhooks", "healthcheck"}; !cmp.Equal(svc.Healthcheck.Test, want) {
		t.Errorf("service healthcheck = %v, want %v", svc.Healthcheck.Test, want)
	}
	hu, _ := url.Parse(healthzURL(cfg.ListenAddr))
	if hu.Port() != containerPort {
		t.Errorf("healthcheck probes port %s, the container port is %s", hu.Port(), containerPort)
	}

	// make dev runs with the same dev values.
	devVars := makeDevVars(t)
	for _, name := range []string{"STRIPE_WEBHOOK_SECRET", "RESEND_WEBHOOK_SECRET", "RESEND_API_KEY", "SUPPORT_INBOUND_ADDRESSES"} {
		if devVars[name] != env[name] {
			t.Errorf("make dev sets %s=%q, docker-compose.yml %q", name, devVars[name], env[name])
		}
	}
}

// makeDevVars reads the NAME="$${NAME:-default}" defaults of the Makefile's
// dev target.
func makeDevVars(t *testing.T) map[string]string {
	t.Helper()
	mk := readRepoFile(t, "Makefile")
	_, recipe, ok := strings.Cut(mk, "\ndev:")
	if !ok {
		t.Fatal("Makefile has no dev target")
	}
	recipe, _, _ = strings.Cut(recipe, "\n\n")
	re := regexp.MustCompile(`([A-Z_]+)="\$\$\{([A-Z_]+):-([^}"]*)\}"`)
	vars := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(recipe, -1) {
		if m[1] == m[2] {
			vars[m[1]] = m[3]
		}
	}
	if len(vars) == 0 {
		t.Fatal("Makefile's dev target sets no NAME=\"$${NAME:-value}\" defaults")
	}
	return vars
}

// --- deploy/ (Kubernetes) ---

type k8sObject struct {
	file     string
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               struct {
			RunAsNonRoot *bool  `yaml:"runAsNonRoot"`
			RunAsUser    *int64 `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []k8sContainer `yaml:"containers"`
	} `yaml:"spec"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef    *struct{ Name, Key string } `yaml:"secretKeyRef"`
			ConfigMapKeyRef *struct{ Name, Key string } `yaml:"configMapKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct{ Name string } `yaml:"configMapRef"`
		SecretRef    *struct{ Name string } `yaml:"secretRef"`
	} `yaml:"envFrom"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

// loadManifests parses every document of every deploy/*.yaml but the
// kustomization.
func loadManifests(t *testing.T) (map[string]k8sObject, []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	var names []string
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		names = append(names, filepath.Base(file))
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			o.file = filepath.Base(file)
			if o.Kind == "Secret" {
				t.Errorf("%s holds a Secret: secrets are referenced by name only", o.file)
			}
			key := o.Kind + "/" + o.Metadata.Name
			if _, dup := objs[key]; dup {
				t.Errorf("%s defined twice", key)
			}
			objs[key] = o
		}
	}
	return objs, names
}

func decodeSpec[T any](t *testing.T, o k8sObject) T {
	t.Helper()
	var v T
	if err := o.Spec.Decode(&v); err != nil {
		t.Fatalf("%s %s: %v", o.file, o.Kind, err)
	}
	return v
}

func mustObject(t *testing.T, objs map[string]k8sObject, key string) k8sObject {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("deploy/ has no %s", key)
	}
	return o
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	t.Parallel()
	var k struct {
		Resources []string `yaml:"resources"`
		Images    []struct {
			Name   string `yaml:"name"`
			NewTag string `yaml:"newTag"`
		} `yaml:"images"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	_, files := loadManifests(t)
	got, want := slices.Sorted(slices.Values(k.Resources)), slices.Sorted(slices.Values(files))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kustomization resources vs deploy/*.yaml (-files +listed):\n%s", diff)
	}
	if len(k.Images) != 1 || k.Images[0].Name != "munchable-webhooks" {
		t.Fatalf("kustomization images = %+v, want the one image name the manifests use", k.Images)
	}
	// The manifests name the image without a tag (checkPodSecurity); the tag
	// is pinned here, once.
	if tag := k.Images[0].NewTag; tag == "" || tag == "latest" {
		t.Errorf("kustomization pins image tag %q, want a release version", tag)
	}
}

// podEnviron is the environment a container gets, with stand-ins from
// validEnv for secret references (their values live in the cluster). It
// fails the test for a name config.go does not read, a secret not taken
// from a Secret, and a reference to a ConfigMap that is not in deploy/.
func podEnviron(t *testing.T, c k8sContainer, objs map[string]k8sObject, known map[string]bool) []string {
	t.Helper()
	secrets := secretNames[config]()
	standIn := validEnv()
	standIn["REDIS_URL"] = "redis://stand-in:6379/0"
	set := func(env map[string]string, name, value, from string) {
		if !known[name] {
			t.Errorf("container %s: %s (%s) is not a variable of config.go", c.Name, name, from)
		}
		if secrets[name] && from != "secretKeyRef" {
			t.Errorf("container %s: secret %s comes from %s, want a secretKeyRef", c.Name, name, from)
		}
		env[name] = value
	}
	configMap := func(name string) map[string]string {
		return mustObject(t, objs, "ConfigMap/"+name).Data
	}
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil {
			t.Errorf("container %s: envFrom a Secret hides which secrets it needs; use secretKeyRef", c.Name)
		}
		if ef.ConfigMapRef != nil {
			for k, v := range configMap(ef.ConfigMapRef.Name) {
				set(env, k, v, "configMapRef")
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			set(env, e.Name, *e.Value, "value")
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if ref.Name == "" || ref.Key == "" {
				t.Errorf("container %s: %s's secretKeyRef lacks a name or key", c.Name, e.Name)
			}
			v, ok := standIn[e.Name]
			if !ok {
				v = "stand-in"
			}
			set(env, e.Name, v, "secretKeyRef")
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := configMap(ref.Name)[ref.Key]
			if !ok {
				t.Errorf("container %s: %s refers to missing key %s of ConfigMap %s", c.Name, e.Name, ref.Key, ref.Name)
			}
			set(env, e.Name, v, "configMapKeyRef")
		default:
			t.Errorf("container %s: %s has no value", c.Name, e.Name)
		}
	}
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

func checkPodSecurity(t *testing.T, what string, pod podTemplate) {
	t.Helper()
	sc := pod.Spec.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		// A numeric user: the image's USER is a name the kubelet cannot check.
		t.Errorf("%s: pod securityContext %+v, want runAsNonRoot and a numeric non-root runAsUser", what, sc)
	}
	for _, c := range pod.Spec.Containers {
		csc := c.SecurityContext
		if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
			csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
			!cmp.Equal(csc.Capabilities.Drop, []string{"ALL"}) {
			t.Errorf("%s container %s: securityContext %+v, want no privilege escalation, a read-only root and all capabilities dropped", what, c.Name, csc)
		}
		for _, r := range []string{"cpu", "memory"} {
			if c.Resources.Requests[r] == "" || c.Resources.Limits[r] == "" {
				t.Errorf("%s container %s: want requests and limits for %s", what, c.Name, r)
			}
		}
		if c.Image != "munchable-webhooks" {
			t.Errorf("%s container %s: image %q, want the name kustomization.yaml rewrites", what, c.Name, c.Image)
		}
	}
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	objs, _ := loadManifests(t)

	// Deployment.
	deployObj := mustObject(t, objs, "Deployment/munchable-webhooks")
	deploy := decodeSpec[struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
	}](t, deployObj)
	// The HPA owns the count: a replicas field would reset it on every apply.
	if deploy.Replicas != nil {
		t.Errorf("deployment sets replicas: %d, while hpa.yaml scales it", *deploy.Replicas)
	}
	pod := deploy.Template
	if !subset(deploy.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("deployment selector %v does not select its pods %v", deploy.Selector.MatchLabels, pod.Metadata.Labels)
	}
	checkPodSecurity(t, "deployment", pod)
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("deployment has %d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if !cmp.Equal(c.Args, []string{"serve"}) {
		t.Errorf("deployment args = %v, want [serve]", c.Args)
	}

	vars := podEnviron(t, c, objs, envNames[config]())
	names := map[string]bool{}
	for _, kv := range vars {
		name, _, _ := strings.Cut(kv, "=")
		names[name] = true
	}
	for _, name := range requiredServeVars(t) {
		if !names[name] {
			t.Errorf("deployment does not provide %s, which the service requires", name)
		}
	}
	cfg, err := loadConfig(vars)
	if err != nil {
		t.Fatalf("the deployment's environment (secrets stood in for) does not load:\n%v", err)
	}

	// Ports and probes: http is LISTEN_ADDR, metrics is METRICS_ADDR.
	port, _ := strconv.Atoi(listenPort(t, cfg.ListenAddr))
	if cfg.MetricsAddr == "" {
		t.Fatal("the deployment does not set METRICS_ADDR: /metrics would be on the public port")
	}
	metricsPort, _ := strconv.Atoi(listenPort(t, cfg.MetricsAddr))
	portByName := map[string]int{}
	for _, p := range c.Ports {
		portByName[p.Name] = p.ContainerPort
	}
	if want := map[string]int{"http": port, "metrics": metricsPort}; !cmp.Equal(portByName, want) || len(c.Ports) != 2 {
		t.Errorf("container ports %+v, want http %d (LISTEN_ADDR) and metrics %d (METRICS_ADDR)", c.Ports, port, metricsPort)
	}
	wantScrape := map[string]string{
		"prometheus.io/scrape": "true",
		"prometheus.io/port":   strconv.Itoa(metricsPort),
		"prometheus.io/path":   "/metrics",
	}
	for k, v := range wantScrape {
		if got := pod.Metadata.Annotations[k]; got != v {
			t.Errorf("pod annotation %s = %q, want %q", k, got, v)
		}
	}
	resolve := func(n yaml.Node) int {
		if p, err := strconv.Atoi(n.Value); err == nil {
			return p
		}
		return portByName[n.Value]
	}
	for _, p := range []struct {
		name  string
		probe *k8sProbe
		path  string
	}{
		{"readiness", c.ReadinessProbe, "/readyz"},
		{"liveness", c.LivenessProbe, "/healthz"},
		{"startup", c.StartupProbe, "/healthz"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			if p.name != "startup" {
				t.Errorf("no %s httpGet probe", p.name)
			}
			continue
		}
		if p.probe.HTTPGet.Path != p.path || resolve(p.probe.HTTPGet.Port) != port {
			t.Errorf("%s probe GET %s on port %q, want %s on %d", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.Value, p.path, port)
		}
	}

	// Shutdown fits in the grace period: the kubelet's SIGKILL must not cut
	// a delivery short.
	pause := 0
	if ps := c.Lifecycle.PreStop; ps != nil && ps.Sleep != nil {
		pause = ps.Sleep.Seconds
	} else {
		t.Error("no preStop sleep: SIGTERM would close the listener while endpoints still route to the pod")
	}
	grace := pod.Spec.TerminationGracePeriodSeconds
	if grace == nil {
		t.Fatal("no terminationGracePeriodSeconds (the default 30 s is under HANDLER_TIMEOUT plus the pause)")
	}
	graceD, pauseD := time.Duration(*grace)*time.Second, time.Duration(pause)*time.Second
	if graceD <= cfg.HandlerTimeout+pauseD {
		t.Errorf("terminationGracePeriodSeconds %d <= HANDLER_TIMEOUT %s + preStop %ds", *grace, cfg.HandlerTimeout, pause)
	}
	// serve's own bound after SIGTERM (serve.go).
	if worst := pauseD + cfg.ShutdownDelay + cfg.HandlerTimeout + 2*cfg.RedisTimeout + 5*time.Second; graceD < worst {
		t.Errorf("terminationGracePeriodSeconds %d < the worst-case shutdown %s", *grace, worst)
	}

	// Service, PDB and HPA point at the deployment's pods.
	svc := decodeSpec[struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			TargetPort yaml.Node `yaml:"targetPort"`
		} `yaml:"ports"`
	}](t, mustObject(t, objs, "Service/munchable-webhooks"))
	if !subset(svc.Selector, pod.Metadata.Labels) {
		t.Errorf("service selector %v does not select the pods %v", svc.Selector, pod.Metadata.Labels)
	}
	for _, p := range svc.Ports {
		switch resolve(p.TargetPort) {
		case port:
		case metricsPort:
			t.Errorf("service exposes the metrics port (targetPort %q) to the load balancer", p.TargetPort.Value)
		default:
			t.Errorf("service targetPort %q is not the container port %d", p.TargetPort.Value, port)
		}
	}

	pdb := decodeSpec[struct {
		MinAvailable   *int          `yaml:"minAvailable"`
		MaxUnavailable *int          `yaml:"maxUnavailable"`
		Selector       labelSelector `yaml:"selector"`
	}](t, mustObject(t, objs, "PodDisruptionBudget/munchable-webhooks"))
	if !subset(pdb.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("PDB selector %v does not select the pods", pdb.Selector.MatchLabels)
	}
	if !(pdb.MinAvailable != nil && *pdb.MinAvailable == 2 && pdb.MaxUnavailable == nil) &&
		!(pdb.MaxUnavailable != nil && *pdb.MaxUnavailable == 1 && pdb.MinAvailable == nil) {
		t.Errorf("PDB = %+v, want minAvailable 2 or maxUnavailable 1", pdb)
	}

	hpa := decodeSpec[struct {
		ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
		MinReplicas    int                         `yaml:"minReplicas"`
		MaxReplicas    int                         `yaml:"maxReplicas"`
		Metrics        []struct {
			Resource struct{ Name string } `yaml:"resource"`
		} `yaml:"metrics"`
	}](t, mustObject(t, objs, "HorizontalPodAutoscaler/munchable-webhooks"))
	if hpa.ScaleTargetRef.Kind != "Deployment" || hpa.ScaleTargetRef.Name != deployObj.Metadata.Name {
		t.Errorf("HPA scales %+v", hpa.ScaleTargetRef)
	}
	// With the PDB's one pod down, at least two keep serving.
	if hpa.MinReplicas < 3 || hpa.MaxReplicas < hpa.MinReplicas {
		t.Errorf("HPA replicas %d..%d, want a floor of at least 3", hpa.MinReplicas, hpa.MaxReplicas)
	}
	if len(hpa.Metrics) != 1 || hpa.Metrics[0].Resource.Name != "cpu" {
		t.Errorf("HPA metrics %+v, want CPU", hpa.Metrics)
	}

	// Migration job: migrate, with only what migrate reads.
	job := decodeSpec[struct {
		Template podTemplate `yaml:"template"`
	}](t, mustObject(t, objs, "Job/munchable-webhooks-migrate"))
	checkPodSecurity(t, "migration job", job.Template)
	if subset(svc.Selector, job.Template.Metadata.Labels) || subset(pdb.Selector.MatchLabels, job.Template.Metadata.Labels) {
		t.Error("the Service or the PDB selects the migration job's pod")
	}
	if len(job.Template.Spec.Containers) != 1 || !cmp.Equal(job.Template.Spec.Containers[0].Args, []string{"migrate"}) {
		t.Fatalf("migration job containers %+v, want one running migrate", job.Template.Spec.Containers)
	}
	jobVars := podEnviron(t, job.Template.Spec.Containers[0], objs, envNames[migrateConfig]())
	requiredMigrate := requiredNames(t, func(env []string) error { _, err := loadMigrateConfig(env); return err })
	for _, name := range requiredMigrate {
		if !slices.ContainsFunc(jobVars, func(kv string) bool { return strings.HasPrefix(kv, name+"=") }) {
			t.Errorf("migration job does not provide %s", name)
		}
	}
	if _, err := loadMigrateConfig(jobVars); err != nil {
		t.Errorf("the migration job's environment does not load: %v", err)
	}
}

// Keeps the messages above honest about what they parse.
func TestShellFields(t *testing.T) {
	t.Parallel()
	got := shellFields(`CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/x './cmd/a b'`)
	want := []string{"CGO_ENABLED=0", "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=${VERSION}", "-o", "/out/x", "./cmd/a b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(fmt.Sprint(diff))
	}
}

// --- deploy/prometheus and deploy/grafana ---

var (
	promQLString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promQLBraces   = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promQLGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promQLIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promQLKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// promQLMetrics returns the metric names an expression reads: identifiers
// that are not functions, keywords, label names or durations.
func promQLMetrics(expr string) []string {
	e := promQLString.ReplaceAllString(expr, `""`)
	e = promQLBraces.ReplaceAllString(e, " ")
	e = promQLGrouping.ReplaceAllString(e, " ")
	var names []string
	for _, loc := range promQLIdent.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(e[loc[0]-1:loc[0]], "0123456789.$") {
			continue // the unit of a number, or a Grafana variable
		}
		if rest := strings.TrimLeft(e[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") || promQLKeywords[name] {
			continue
		}
		names = append(names, name)
	}
	return names
}

func TestPromQLMetrics(t *testing.T) {
	t.Parallel()
	got := promQLMetrics(`sum by (provider, le) (rate(a_seconds_bucket{le="30", x=~"a|b"}[5m])) / on(provider) group_left count(b_total offset 1h) > 0.05 and c unless d_total{reason="no_redis"} * 2e3`)
	want := []string{"a_seconds_bucket", "b_total", "c", "d_total"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("promQLMetrics (-want +got):\n%s", diff)
	}
}

// observabilityExprs returns every PromQL expression of the alerting rules
// and the dashboard, keyed by where it is.
func observabilityExprs(t *testing.T) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	for _, r := range alertRules(t) {
		exprs["alert "+r.Alert] = r.Expr
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(readRepoFile(t, "deploy/grafana/munchable-webhooks.json")), &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			exprs[fmt.Sprintf("panel %q #%d", p.Title, i+1)] = tg.Expr
		}
	}
	return exprs
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/prometheus/alerts.yaml")), &f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("alerts.yaml has no rules")
	}
	return rules
}

// exportedMetrics scrapes a running service and returns its metric families
// by name, with their types, and the sample lines.
func exportedMetrics(t *testing.T) (families map[string]string, samples []string) {
	t.Helper()
	s := startService(t, nil)
	r, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	families = map[string]string{}
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = f[3]
		} else if !strings.HasPrefix(sc.Text(), "#") {
			samples = append(samples, sc.Text())
		}
	}
	if len(families) < 10 {
		t.Fatalf("scraped only %v", families)
	}
	return families, samples
}

// promQLBucketBound finds a histogram bucket chosen by its bound.
var promQLBucketBound = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*_bucket)\{[^}]*\ble="([^"]+)"`)

// Every metric the dashboard and the alerts read is one the service exports
// (a histogram's _bucket, _sum and _count series included): a renamed or
// never-written metric would leave a panel empty and an alert silent.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	exprs := observabilityExprs(t)
	families, samples := exportedMetrics(t)
	exported := func(name string) bool {
		if _, ok := families[name]; ok {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && (families[base] == "histogram" || families[base] == "summary") {
				return true
			}
		}
		return false
	}
	for _, where := range slices.Sorted(maps.Keys(exprs)) {
		names := promQLMetrics(exprs[where])
		if len(names) == 0 {
			t.Errorf("%s reads no metric: %s", where, exprs[where])
		}
		for _, name := range names {
			if !exported(name) {
				t.Errorf("%s reads %s, which the service does not export", where, name)
			}
		}
		// A bucket picked by its bound must be one of the histogram's: with
		// other buckets the selector matches nothing and the alert is mute.
		for _, m := range promQLBucketBound.FindAllStringSubmatch(exprs[where], -1) {
			bound := `le="` + m[2] + `"`
			if !slices.ContainsFunc(samples, func(l string) bool { return strings.HasPrefix(l, m[1]+"{") && strings.Contains(l, bound) }) {
				t.Errorf("%s reads %s{%s}, which is not a bucket the service exports", where, m[1], bound)
			}
		}
	}
}

// githubAnchors returns the anchors GitHub gives a Markdown file's headings.
func githubAnchors(markdown string) map[string]bool {
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
	for line := range strings.SplitSeq(markdown, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		anchors[a] = true
	}
	return anchors
}

// Each alert has a severity and a runbook section that exists.
func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	const runbook = "https://github.com/munchable/munchable-webhooks/blob/main/docs/OPERATIONS.md#"
	anchors := githubAnchors(readRepoFile(t, "docs/OPERATIONS.md"))
	for _, r := range alertRules(t) {
		if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" && sev != "info" {
			t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, sev)
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbook)
		if !ok || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q is not a section of docs/OPERATIONS.md", r.Alert, r.Annotations["runbook_url"])
		}
		if r.Annotations["summary"] == "" {
			t.Errorf("%s has no summary", r.Alert)
		}
	}
}

// make dev, test and lint install what each needs first (scripts/ensure-deps
// with the target's name), and CI runs the same script for all of them before
// anything else: what CI installs is what a newcomer gets.
func TestEnsureDepsRunsFirst(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	for _, target := range []string{"dev", "test", "lint"} {
		// --no-print-directory: under `make test` this runs as a sub-make,
		// which would otherwise print "Entering directory" first.
		cmd := exec.Command("make", "--no-print-directory", "-n", target)
		cmd.Dir = repoRoot
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make -n %s: %v", target, err)
		}
		if first, _, _ := strings.Cut(string(out), "\n"); first != "scripts/ensure-deps "+target {
			t.Errorf("make %s runs %q first, want scripts/ensure-deps %s", target, first, target)
		}
	}
	var steps []string
	for line := range strings.SplitSeq(readRepoFile(t, ".ci/run"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "make" || f[0] == "scripts/ensure-deps") {
			steps = append(steps, strings.Join(f, " "))
		}
	}
	// Without an argument: everything any target needs.
	if len(steps) < 2 || steps[0] != "scripts/ensure-deps" {
		t.Errorf(".ci/run steps %q, want scripts/ensure-deps (no argument: all) before make", steps)
	}
}
