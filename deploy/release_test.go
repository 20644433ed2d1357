package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type workflowStep struct {
	Uses string            `yaml:"uses"`
	Run  string            `yaml:"run"`
	With map[string]string `yaml:"with"`
}

// The release workflow builds what the manifests run: the image name the
// kustomization pins, for both architectures, after the tests, with the
// tag as the VERSION the Dockerfile builds into the binary. (actionlint,
// in make lint, checks the rest of the file.)
func TestReleaseWorkflow(t *testing.T) {
	t.Parallel()
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Env  map[string]string `yaml:"env"`
		Jobs map[string]struct {
			Needs yaml.Node      `yaml:"needs"`
			Steps []workflowStep `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, ".github/workflows/release.yml")), &wf); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wf.On.Push.Tags, []string{"v*"}) {
		t.Errorf("release runs on tags %v, want [v*]", wf.On.Push.Tags)
	}
	if want := kustomizeImage(t); wf.Env["IMAGE"] != want {
		t.Errorf("release pushes %q, the kustomization pins %q", wf.Env["IMAGE"], want)
	}
	image := wf.Jobs["image"]
	if image.Needs.Value != "test" || !slices.ContainsFunc(wf.Jobs["test"].Steps, func(s workflowStep) bool {
		return strings.Contains(s.Run, ".ci/run")
	}) {
		t.Error("the image job does not wait for a test job that runs .ci/run")
	}
	i := slices.IndexFunc(image.Steps, func(s workflowStep) bool {
		return strings.HasPrefix(s.Uses, "docker/build-push-action@")
	})
	if i < 0 {
		t.Fatal("the image job has no docker/build-push-action step")
	}
	with := image.Steps[i].With
	if with["platforms"] != "linux/amd64,linux/arm64" || with["push"] != "true" ||
		with["build-args"] != "VERSION=${{ github.ref_name }}\nCOMMIT=${{ github.sha }}\n" || !strings.HasPrefix(with["tags"], "${{ env.IMAGE }}:") {
		t.Errorf("build-push-action with %v, want both architectures pushed as ${{ env.IMAGE }}:VERSION, with build-args VERSION=${{ github.ref_name }} and COMMIT=${{ github.sha }}", with)
	}
}

// kustomizeImage is the image the kustomization runs, without its tag.
func kustomizeImage(t *testing.T) string {
	t.Helper()
	k := readKustomization(t)
	if len(k.Images) != 1 {
		t.Fatalf("kustomization images = %+v, want one", k.Images)
	}
	return k.Images[0].NewName
}
