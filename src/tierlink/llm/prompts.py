"""Everyday questions a chat fleet is asked: the demo's chat phase and the chat benchmarks
draw from the same lists (torch-free)."""

# Short everyday prompts the model benchmarks compare runtimes and splits on
# (benchmarks/llm_split.py, benchmarks/llm_runtimes.py)
SHORT_PROMPTS = (
    "Name three colours of the rainbow.",
    "What is the capital of France, and why is it famous?",
    "Write one sentence about the sea.",
    "Explain what a cache is to a child.",
    "Give me a tip for learning to cook.",
    "Why do leaves change colour in autumn?",
    "Describe a cat in two sentences.",
    "What should I pack for a day hike?",
)

QUESTIONS = (
    "What is the capital of France?", "Write a haiku about the sea.",
    "List three fruits and their colours.", "How do I boil an egg?",
    "Explain photosynthesis in two sentences.", "What is a prime number?",
    "Give me a tip for learning to code.", "Why is the sky blue?",
    "Describe a cat to someone who has never seen one.", "What does a compiler do?",
    "Name three planets of the solar system.", "How can I sleep better?",
    "What is the difference between weather and climate?", "Suggest a name for a dog.",
    "Summarise the plot of Cinderella.", "What is machine learning?",
    "How many legs does a spider have?", "What is the boiling point of water?",
    "Write one sentence about autumn.", "What is a noun?",
    "Give me a synonym for happy.", "What causes rain?",
    "How do plants drink water?", "What is the largest ocean?",
    "Translate 'thank you' into Spanish.", "What is gravity?",
    "Name a famous painter.", "Why do we need sleep?",
    "What is an atom?", "How do I make tea?",
)
