package deploy

import (
	"fmt"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
)

// Compose is what docker-compose.yml says, as far as the tests read it.
type Compose struct {
	Services map[string]ComposeService `yaml:"services"`
}

// ComposeService is one service of docker-compose.yml.
type ComposeService struct {
	Image string `yaml:"image"`
	Build struct {
		Context    string            `yaml:"context"`
		Dockerfile string            `yaml:"dockerfile"`
		Args       map[string]string `yaml:"args"`
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

// Environ is the service's environment as NAME=value lines.
func (s ComposeService) Environ() []string {
	var out []string
	for k, v := range s.Environment {
		out = append(out, k+"="+v)
	}
	return out
}

// ReadCompose parses root's docker-compose.yml.
func ReadCompose(root string) (Compose, error) {
	var c Compose
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		return c, err
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("docker-compose.yml: %w", err)
	}
	return c, nil
}
