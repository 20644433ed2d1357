package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
)

// The ceilings must run exactly what the service runs, so the upsert SQL and
// the claim script are read out of the service's own source files rather
// than copied: one source of truth, and nothing exported for the harness.

// upsertSQL returns the entitlements guard statement (const applySQL).
func upsertSQL(root string) (string, error) {
	return stringDecl(filepath.Join(root, "internal", "entitlements", "entitlements.go"), "applySQL")
}

// claimScriptSource returns the Lua claim script (var claimScript =
// redis.NewScript(`...`)).
func claimScriptSource(root string) (string, error) {
	return stringDecl(filepath.Join(root, "internal", "claim", "store.go"), "claimScript")
}

// stringDecl finds the package-level const or var called name in file and
// returns its string literal: the value itself, or the first argument of the
// call that initialises it.
func stringDecl(file, name string) (string, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	f, err := parser.ParseFile(token.NewFileSet(), file, src, 0)
	if err != nil {
		return "", err
	}
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range gen.Specs {
			vs, ok := spec.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for i, id := range vs.Names {
				if id.Name != name || i >= len(vs.Values) {
					continue
				}
				expr := vs.Values[i]
				if call, ok := expr.(*ast.CallExpr); ok && len(call.Args) > 0 {
					expr = call.Args[0]
				}
				lit, ok := expr.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return "", fmt.Errorf("%s: %s is not a string literal", file, name)
				}
				return strconv.Unquote(lit.Value)
			}
		}
	}
	return "", fmt.Errorf("%s: no declaration of %s", file, name)
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}
