package tokenizer_test

import (
	"fmt"

	"github.com/kvcar/kvcar/internal/tokenizer"
)

func Example() {
	// The directory the engine was started with (--tokenizer_path).
	tk, err := tokenizer.Load("testdata/qwen2like")
	if err != nil {
		fmt.Println(err)
		return
	}
	prompt, _ := tk.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "hello world"}}, true)
	fmt.Printf("%q\n", prompt)

	ids, _ := tk.EncodeChat([]tokenizer.Message{{Role: "user", Content: "hello world"}}, nil)
	text, _ := tk.Decode(ids)
	fmt.Println(len(ids), text == prompt)

	ids, _ = tk.Encode("hello world", nil)
	fmt.Println(ids)
	// Output:
	// "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
	// 49 true
	// [263 268]
}
