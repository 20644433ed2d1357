package deploy

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// devDefault is one NAME="$${NAME:-default}" line of the dev recipe.
var devDefault = regexp.MustCompile(`([A-Z_]+)="\$\$\{([A-Z_]+):-([^}"]*)\}"`)

// MakeDevVars reads the NAME="$${NAME:-default}" defaults of the Makefile's
// dev target under root: the variables make dev sets unless the
// environment does. (A regular expression, not a parser: these lines are
// all it needs to read, and a Makefile parser would not expand the shell's
// ${NAME:-default} either.)
func MakeDevVars(root string) (map[string]string, error) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		return nil, err
	}
	_, recipe, ok := strings.Cut(string(mk), "\ndev:")
	if !ok {
		return nil, errors.New("no dev target in the Makefile")
	}
	recipe, _, _ = strings.Cut(recipe, "\n\n")
	vars := map[string]string{}
	for _, m := range devDefault.FindAllStringSubmatch(recipe, -1) {
		if m[1] == m[2] {
			vars[m[1]] = m[3]
		}
	}
	if len(vars) == 0 {
		return nil, errors.New(`the Makefile's dev target sets no NAME="$${NAME:-value}" defaults`)
	}
	return vars, nil
}
