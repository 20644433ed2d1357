package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mattn/go-shellwords"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// Instruction is one Dockerfile instruction as BuildKit parses it: the
// keyword in upper case, its --flags, and its arguments (a shell-form
// command is one argument; JSON form, one per element).
type Instruction struct {
	Cmd   string
	Flags []string
	Args  []string
	JSON  bool
}

// Dockerfile is the instructions of each build stage, in order.
type Dockerfile struct {
	Stages [][]Instruction
}

// ReadDockerfile parses the Dockerfile at path.
func ReadDockerfile(path string) (Dockerfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return Dockerfile{}, err
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return Dockerfile{}, fmt.Errorf("%s: %w", path, err)
	}
	var d Dockerfile
	for _, n := range res.AST.Children {
		in := Instruction{Cmd: strings.ToUpper(n.Value), Flags: n.Flags, JSON: n.Attributes["json"]}
		for a := n.Next; a != nil; a = a.Next {
			in.Args = append(in.Args, a.Value)
		}
		if in.Cmd == "FROM" {
			d.Stages = append(d.Stages, nil)
		}
		if len(d.Stages) == 0 {
			return Dockerfile{}, fmt.Errorf("%s: %s before FROM", path, in.Cmd)
		}
		d.Stages[len(d.Stages)-1] = append(d.Stages[len(d.Stages)-1], in)
	}
	return d, nil
}

// Final is the last stage: what the image is.
func (d Dockerfile) Final() []Instruction { return d.Stages[len(d.Stages)-1] }

// GoBuild is a `go build` command line.
type GoBuild struct {
	Env     []string // NAME=value assignments before "go build"
	Flags   []string // between "build" and "-o"
	Output  string
	Package string
}

// GoBuild finds the one RUN that runs go build and splits it into words
// as sh would (expansions such as ${VERSION} stay as written).
func (d Dockerfile) GoBuild() (GoBuild, error) {
	var found []GoBuild
	for _, stage := range d.Stages {
		for _, in := range stage {
			if in.Cmd != "RUN" || len(in.Args) != 1 || !strings.Contains(in.Args[0], "go build") {
				continue
			}
			b, err := ParseGoBuild(in.Args[0])
			if err != nil {
				return GoBuild{}, fmt.Errorf("Dockerfile: %w", err)
			}
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return GoBuild{}, fmt.Errorf("the Dockerfile has %d go build lines, want 1", len(found))
	}
	return found[0], nil
}

// ParseGoBuild reads "[NAME=value ...] go build FLAGS -o OUTPUT PACKAGE".
func ParseGoBuild(line string) (GoBuild, error) {
	f, err := shellwords.Parse(line)
	if err != nil {
		return GoBuild{}, fmt.Errorf("go build line %q: %w", line, err)
	}
	i, o := slices.Index(f, "go"), slices.Index(f, "-o")
	if i < 0 || i+1 >= len(f) || f[i+1] != "build" || o < i || o+2 >= len(f) {
		return GoBuild{}, fmt.Errorf("cannot read the go build line %q", line)
	}
	var b GoBuild
	for _, w := range f[:i] {
		if strings.Contains(w, "=") && !strings.HasPrefix(w, "-") {
			b.Env = append(b.Env, w)
		}
	}
	b.Flags, b.Output, b.Package = f[i+2:o], f[o+1], f[o+2]
	return b, nil
}

// MakefileBuildFlags returns the words of the Makefile's BUILD_FLAGS, as
// written (Make's $(VERSION) included).
func MakefileBuildFlags(root string) ([]string, error) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(mk), "\n") {
		if v, ok := strings.CutPrefix(line, "BUILD_FLAGS :="); ok {
			return shellwords.Parse(v)
		}
	}
	return nil, fmt.Errorf("the Makefile has no BUILD_FLAGS := line")
}
