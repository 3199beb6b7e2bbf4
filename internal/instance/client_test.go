package instance

import "testing"

func TestClientConfigAuth(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := ClientConfig([]string{"127.0.0.1:2379"}, env(map[string]string{EnvEtcdUsername: "u", EnvEtcdPassword: "p"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Username != "u" || cfg.Password != "p" || cfg.Endpoints[0] != "127.0.0.1:2379" || cfg.DialTimeout <= 0 || cfg.Logger == nil {
		t.Errorf("config %+v", cfg)
	}
	cfg, err = ClientConfig([]string{"e"}, env(nil), nil)
	if err != nil || cfg.Username != "" || cfg.Password != "" {
		t.Errorf("without auth: %+v %v", cfg, err)
	}
	for _, m := range []map[string]string{{EnvEtcdUsername: "u"}, {EnvEtcdPassword: "p"}} {
		if _, err := ClientConfig([]string{"e"}, env(m), nil); err == nil {
			t.Errorf("%v: only one of user and password accepted", m)
		}
	}
}
