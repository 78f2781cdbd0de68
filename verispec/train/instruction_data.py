"""The topics, texts and code the chat instructions are built from (see instructions.py), all
written for this project. Invented names and subjects of the benchmark's chat workload are
deliberately absent, so that workload stays a clean held-out evaluation.
"""

from __future__ import annotations


def items(text: str) -> tuple[str, ...]:
    """The ';'-separated entries of text, stripped: items("a; b ;c") == ("a", "b", "c")."""
    return tuple(part.strip() for part in text.split(";") if part.strip())


CONCEPTS = items(
    "inflation; the greenhouse effect; supply and demand; opportunity cost; natural selection; "
    "plate tectonics; black holes; DNA replication; the water cycle; public-key encryption; "
    "machine learning; a neural network; an API; version control; Big O notation; "
    "object-oriented programming; a database index; DNS; the stock market; interest rates; "
    "a mortgage; the placebo effect; cognitive dissonance; entropy; Newton's third law; "
    "the Doppler effect; an electric circuit; antibiotic resistance; blockchain; cloud computing; "
    "the scientific method; the Pythagorean theorem; probability; standard deviation; "
    "the Roman Republic; the Industrial Revolution; the Renaissance; the Cold War; democracy; "
    "the separation of powers; a compiler; garbage collection; an operating system; a VPN; "
    "two-factor authentication; GPS; nuclear fusion; solar panels; the carbon cycle; erosion; "
    "the ozone layer; metabolism; the circulatory system; muscle memory; a sonnet; irony; "
    "game theory; the Turing test; gross domestic product; a recession; tariffs; "
    "the electoral college; a hash table; a REST API; continuous integration; unit testing"
)

TERMS = items(
    "serendipity; ubiquitous; ephemeral; pragmatic; resilience; empathy; metaphor; hyperbole; "
    "algorithm; latency; bandwidth; equity; nostalgia; paradigm; catalyst; ambiguous; "
    "redundant; mitigate; idiom; alliteration; procrastination; sustainability; biodiversity; "
    "inertia; photosynthetic; symbiosis; quorum; benchmark; deprecated; idempotent; "
    "refactoring; heuristic; entrepreneur; liquidity; depreciation; gentrification; "
    "filibuster; veto; anecdote; satire; euphemism; oxymoron; juxtaposition; meticulous; "
    "candid; frugal; altruism; stoicism; dichotomy; zeitgeist"
)

COUNTS = ("three", "four", "five", "six", "seven", "eight", "ten")
LIST_SUBJECTS = items(
    "ways to reduce stress; famous paintings and the artists who made them; healthy breakfast "
    "ideas; board games for a family evening; common mistakes new programmers make; benefits "
    "of regular exercise; questions to ask at the end of a job interview; important inventions "
    "of the 19th century; ways to save energy at home; classic novels worth reading; names for "
    "a pet goldfish; uses for baking soda around the house; tips for writing a good essay; "
    "countries in South America and their capitals; planets of the solar system with one fact "
    "each; programming languages and what they are mostly used for; signs that a website might "
    "be a scam; things to check before buying a used car; ideas for a rainy day with kids; "
    "good habits for people who work from home; cheap hobbies to pick up this year; birds "
    "commonly seen in city parks; ways to make a small flat feel bigger; famous scientists and "
    "their discoveries; easy dinners that take less than 20 minutes; things to do on a long "
    "train journey; icebreaker questions for a team meeting; features of a good password "
    "manager; reasons to learn a second language; mammals that live in the ocean; common "
    "causes of a slow computer; ways to be a better listener; gift ideas for a coworker who is "
    "retiring; foods that are high in protein for vegetarians; useful keyboard shortcuts; "
    "famous bridges around the world; ways to reduce plastic waste; skills every manager "
    "needs; questions to ask a landlord before renting; popular dog breeds for apartments; "
    "key events of the French Revolution; ingredients for a basic tomato sauce; Linux commands "
    "every beginner should know; ways to stay focused while working; podcast ideas for a "
    "history fan; safety tips for cycling in a city; traditional dishes from Japan; "
    "myths about the human brain; simple science experiments for kids; things to include "
    "in a first aid kit"
)
LISTS = tuple((COUNTS[j % len(COUNTS)], subject) for j, subject in enumerate(LIST_SUBJECTS))

PAIRS = items(
    "a list / a tuple in Python; weather / climate; a virus / a bacterium; renting a home / "
    "buying one; TCP / UDP; RAM / disk storage; a crocodile / an alligator; baking soda / "
    "baking powder; stocks / bonds; a comet / an asteroid; electric cars / petrol cars; "
    "Python / JavaScript; a simile / a metaphor; mitosis / meiosis; a debit card / a credit "
    "card; tea / coffee; an LED bulb / an incandescent bulb; weight / mass; speed / velocity; "
    "a hurricane / a tornado; affect / effect; email / chat apps for work; reading on paper / "
    "reading on a screen; git merge / git rebase; a process / a thread; static typing / "
    "dynamic typing; alternating current / direct current; a loan / a lease; fission / fusion; "
    "a virtual machine / a container; UX design / UI design; ebooks / printed books; "
    "a latte / a cappuccino; running / swimming for fitness; a cat / a dog as a pet; SQL "
    "databases / NoSQL databases; a sprint / a marathon training plan; a novel / a novella; "
    "an introvert / an extrovert; a spreadsheet / a database"
)
COMPARE = tuple(tuple(pair.split(" / ")) for pair in PAIRS)

STORIES = items(
    "a robot who learns to paint; a lighthouse keeper who finds a message in a bottle; a child "
    "who can talk to birds; the last day of summer camp; a detective who is afraid of the "
    "dark; an umbrella that is lost and travels the world; a baker who bakes a cake for a "
    "dragon; two strangers stuck in a lift; a cat who becomes mayor of a small town; a girl "
    "who finds a map in her grandfather's attic; a time traveller who only goes back ten "
    "minutes; a tree that remembers everyone who sat under it; an astronaut who misses the "
    "rain; a chess game in a park that lasts a whole summer; a shy ghost; a postman delivering "
    "the last letter of his career; a family road trip where everything goes wrong; a "
    "village where it never stops snowing; a violin that plays by itself; a boy who trains a "
    "crow; a library that is open only at midnight; a penguin who wants to fly; a grumpy "
    "neighbour and a lost kitten; a submarine crew that hears singing; an old clock repairer; "
    "a school play that goes terribly wrong; a friendship between a mouse and an owl; the "
    "first person to live on Mars; a street musician who becomes famous by accident; a "
    "garden gnome that comes to life"
)

POEMS = items(
    "the ocean at night; autumn leaves; a cup of coffee on a Monday morning; a city waking up; "
    "the first snow of winter; an old pair of boots; friendship; the sound of rain on a roof; "
    "a cat sleeping in the sun; the stars over the desert; a train station at dawn; missing "
    "home; a thunderstorm; spring flowers; the moon over a lake; growing older; a library; "
    "a forgotten birthday; the smell of fresh bread; a mountain hike; a bicycle ride; "
    "learning to code; a lighthouse; a busy kitchen; a quiet Sunday; the end of a long "
    "journey; a river in flood; a child's first steps; an empty playground; a summer evening"
)

EMAILS = items(
    "to my manager asking for next Friday off; thanking a colleague for helping with a "
    "project; complaining to a hotel about a noisy room; inviting my neighbours to a street "
    "party; following up after a job interview; asking a professor for an extension on an "
    "essay; cancelling a gym membership; telling a client that their order will be late; "
    "asking my landlord to fix a leaking tap; welcoming a new member to the team; reminding "
    "my team about tomorrow's deadline; apologising for missing a meeting; asking a company "
    "for a refund for a broken kettle; congratulating a friend on a new job; declining a "
    "job offer politely; requesting a letter of recommendation; introducing myself to a new "
    "client; asking for feedback on a presentation; inviting colleagues to a farewell lunch; "
    "informing parents about a school trip; asking a shop whether an item is back in stock; "
    "to a teacher explaining that my child was ill; announcing a new office opening time; "
    "to a supplier asking for a better price; asking a friend to return a borrowed book; "
    "to a conference organiser asking about accessibility; thanking a host after a dinner "
    "party; proposing a new weekly meeting time; resigning from my job with two weeks' notice; "
    "asking my bank about an unknown charge"
)

HOW_TO = items(
    "change a flat tyre on a bicycle; remove a red wine stain from a carpet; set up a Python "
    "virtual environment; write a good cover letter; boil an egg so the yolk stays soft; "
    "back up the photos on my phone; start a vegetable garden on a balcony; tie a bowline "
    "knot; prepare for a long-haul flight; make a simple monthly budget; learn to touch type; "
    "clean a cast-iron pan; improve my handwriting; memorise a speech; get rid of fruit flies "
    "in the kitchen; make cold brew coffee; hang a picture straight; write a unit test in "
    "Python; resolve a merge conflict in git; jump-start a car; teach a dog to sit; cut down "
    "my screen time; make a paper aeroplane that flies far; sharpen a kitchen knife; create a "
    "strong password I can remember; read a nutrition label; keep basil alive indoors; start "
    "journaling; negotiate a higher salary; prepare for a video job interview; remove a "
    "stripped screw; plan a week of meals; make a simple web page with HTML; clean a laptop "
    "keyboard; fold a fitted sheet; check the oil level in a car; learn the basics of chess; "
    "take better photos with my phone; stop a door from squeaking; make pancakes without eggs; "
    "read a CSV file with pandas; find a memory leak in a program; wash a wool jumper; "
    "meditate for the first time; prepare a five-minute presentation; convert a Word "
    "document to PDF; unclog a bathroom sink; use a French press; write a good commit "
    "message; organise a small wedding on a budget"
)

FUNCTIONS = items(
    "checks whether a string is a palindrome; returns the n-th Fibonacci number; merges two "
    "sorted lists into one sorted list; removes duplicates from a list while keeping the "
    "order; converts a temperature from Celsius to Fahrenheit; counts how often each word "
    "appears in a text; flattens a list of lists; checks whether two strings are anagrams; "
    "returns the second largest number in a list; computes the factorial of n without "
    "recursion; converts a Roman numeral to an integer; splits a list into chunks of size n; "
    "returns the greatest common divisor of two numbers; reads a CSV file and returns its "
    "rows as dictionaries; finds the longest word in a sentence; rotates a list by k "
    "positions; capitalises the first letter of every word; computes the average of a list "
    "of numbers, ignoring None values; checks whether a number is a power of two; transposes "
    "a matrix given as a list of lists; returns all primes below n with the sieve of "
    "Eratosthenes; converts a number of seconds into hours, minutes and seconds; finds the "
    "most common element in a list; implements binary search on a sorted list; checks "
    "whether the brackets in a string are balanced; generates a random password of a given "
    "length; sums the digits of an integer; groups a list of words by their first letter; "
    "counts the lines, words and characters in a file; converts a binary string to an "
    "integer without using int(); returns the common elements of two lists; computes the "
    "running total of a list; parses a date like 2024-03-15 into a (year, month, day) tuple; "
    "merges two dictionaries, adding the values of shared keys; returns the median of a list; "
    "finds all pairs in a list that add up to a target; compresses a string like 'aaabb' "
    "into 'a3b2'; computes the distance between two points in 2D; removes punctuation from a "
    "string; finds the first character that repeats in a string; sorts a list of "
    "dictionaries by a given key; returns the n largest items of a list; validates that a "
    "password has a digit, a capital letter and at least 8 characters; converts a snake_case "
    "name to camelCase; checks whether a list is sorted; turns a list of names into an "
    "English phrase like 'A, B and C'; computes compound growth of a population over n years; "
    "shuffles a list without using random.shuffle; returns the number of days between two "
    "dates; checks whether a sudoku row is valid"
)

SNIPPETS = (
    "nums = [3, 1, 4, 1, 5]\nsquares = [n * n for n in nums if n % 2 == 1]\nprint(squares)",
    "def f(s):\n    return s == s[::-1]",
    "counts = {}\nfor word in text.split():\n    counts[word] = counts.get(word, 0) + 1",
    "with open('data.txt') as fh:\n    lines = [line.strip() for line in fh if line.strip()]",
    "x = [1, 2, 3]\ny = x\ny.append(4)\nprint(x)",
    "def memo(fn):\n    cache = {}\n    def wrapper(n):\n        if n not in cache:\n"
    "            cache[n] = fn(n)\n        return cache[n]\n    return wrapper",
    "pairs = sorted(zip(names, scores), key=lambda p: p[1], reverse=True)",
    "import re\nemails = re.findall(r'[\\w.]+@[\\w.]+', text)",
    "try:\n    value = int(user_input)\nexcept ValueError:\n    value = 0",
    "def gen(n):\n    for i in range(n):\n        yield i * 2",
    "average_length = sum(len(w) for w in words) / len(words)",
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def __call__(self):\n"
    "        self.n += 1\n        return self.n",
    "matrix = [[1, 2], [3, 4]]\nflat = [x for row in matrix for x in row]",
    "from collections import deque\nq = deque(maxlen=3)\nfor i in range(5):\n    q.append(i)\n"
    "print(list(q))",
    "import sys\nprint(' '.join(sys.argv[1:]).upper())",
)

BUGS = (
    ("return the average of a list of numbers",
     "def average(nums):\n    total = 0\n    for n in nums:\n        total += n\n"
     "    return total // len(nums)"),
    ("return the factorial of n",
     "def factorial(n):\n    result = 0\n    for i in range(1, n + 1):\n        result *= i\n"
     "    return result"),
    ("return the last element of a list", "def last(items):\n    return items[len(items)]"),
    ("return a new list holding only the given item each time it is called",
     "def start_list(item, items=[]):\n    items.append(item)\n    return items"),
    ("print a countdown from n to 1",
     "def countdown(n):\n    while n > 0:\n        print(n)\n    n -= 1"),
    ("return True when a number is even",
     "def is_even(n):\n    if n % 2 == 1:\n        return True\n    return False"),
    ("return the sum of the numbers from 1 to n", "def total(n):\n    return sum(range(n))"),
    ("remove every negative number from a list",
     "def drop_negatives(nums):\n    for n in nums:\n        if n < 0:\n"
     "            nums.remove(n)\n    return nums"),
    ("return the biggest number in a list that may hold only negative numbers",
     "def biggest(nums):\n    best = 0\n    for n in nums:\n        if n > best:\n"
     "            best = n\n    return best"),
    ("read a number from the user and print it doubled",
     "n = input('Number: ')\nprint(n * 2)"),
    ("check whether a word is in a list, ignoring upper and lower case",
     "def contains(words, word):\n    return word.lower() in words"),
    ("print 'equal' because 0.1 + 0.2 is 0.3", "if 0.1 + 0.2 == 0.3:\n    print('equal')"),
)  # fmt: skip

ADVICE = items(
    "I keep putting off my university assignments until the night before; I have my first "
    "job interview next week and I'm really nervous; I can't fall asleep before two in the "
    "morning; I want to start running but I always give up after a week; I just moved to a "
    "new city and don't know anyone; I made a mistake in a report and need to tell my "
    "manager; I spend far too much money on takeaway food; My flatmate never does the "
    "dishes; I want to switch careers from teaching to software development; I get "
    "distracted by my phone whenever I try to work; My teenage son barely talks to me "
    "anymore; I have to give a speech at my sister's wedding; I'm thinking about adopting a "
    "cat but I work long hours; I want to read more books but never find the time; My team "
    "at work keeps missing deadlines; I feel overwhelmed by my email inbox; I want to learn "
    "Italian on my own; I got two job offers and can't decide between them; My grandmother "
    "wants to learn to use a smartphone; I have a long commute and want to use the time "
    "better; I forget people's names right after I meet them; I'm planning my first trip "
    "abroad on my own; Code reviews on my team always take forever; I want to eat more "
    "healthily without spending a lot; I'm starting a small online shop selling candles; "
    "I'm nervous about asking for a pay rise; My neighbour plays loud music late at night; "
    "I want to get back into exercise after a knee injury; One person in my group project "
    "does nothing; I'm a new manager and one of my reports is also my friend; I want to stop "
    "biting my nails; My tomato seedlings keep falling over; I'm moving in with my partner "
    "for the first time; I'm behind in my maths course and the exam is in a month; I'd like "
    "to volunteer but don't know where to start; My old laptop has become very slow; I want "
    "to save for a house deposit; I find it hard to speak up in meetings; I want to write a "
    "novel but I never finish anything; My daughter is scared of going to the dentist"
)

FACTS = items(
    "What is the capital of Australia?; Who wrote Pride and Prejudice?; How many bones are "
    "in the adult human body?; What is the speed of light?; When did the Berlin Wall fall?; "
    "What language is spoken in Brazil?; What is the largest ocean on Earth?; Who painted "
    "the Mona Lisa?; What is the chemical symbol for gold?; How many continents are there?; "
    "What is the tallest mountain in the world?; Which planet is known as the Red Planet?; "
    "Who developed the theory of general relativity?; What is the longest river in Africa?; "
    "How many players are on a football team?; What gas do plants take in from the air?; "
    "Who was the first woman to win a Nobel Prize?; What is the smallest prime number?; "
    "In which year did the Titanic sink?; What is the currency of Japan?; How many hearts "
    "does an octopus have?; What is the hardest natural material?; Who invented the "
    "telephone?; What is the freezing point of water in Fahrenheit?; Which country has the "
    "largest population?; What does CPU stand for?; Who wrote the play Hamlet?; What is the "
    "largest desert in the world?; How long does light from the Sun take to reach Earth?; "
    "What is the main ingredient of guacamole?; Which element has the atomic number 1?; "
    "What is the capital of Canada?; Who composed the Four Seasons?; How many sides does a "
    "hexagon have?; What is the largest organ of the human body?; When did the Second World "
    "War end?; What is the square root of 144?; Which animal is the fastest on land?; What "
    "is the official language of Egypt?; Who was Ada Lovelace?; What is a light-year?; What "
    "is the deepest point in the ocean?; Which country gave the Statue of Liberty to the "
    "United States?; What does HTML stand for?; How many minutes are in a day?; What is the "
    "capital of Kenya?; Who discovered penicillin?; What is the most spoken language in the "
    "world?; How many strings does a standard guitar have?; Which metal is liquid at room "
    "temperature?; What year did the first iPhone come out?; What is the largest planet in "
    "the solar system?; What do bees make besides honey?; Who was Nelson Mandela?; What is "
    "the capital of Argentina?; How many teeth does an adult human have?; What is the "
    "Great Wall of China made of?; Who wrote One Hundred Years of Solitude?; What is the "
    "boiling point of ethanol?; Which blood type is the universal donor?; What is the "
    "population of the world, roughly?; What is the capital of South Korea?; Who invented "
    "the World Wide Web?; What causes thunder?; What is the main language of Quebec?; How "
    "many time zones does Russia have?; What is the oldest university in Europe?; What is "
    "a group of crows called?; Which ocean lies between Africa and Australia?; How tall is "
    "the Eiffel Tower?"
)

PARAGRAPHS = (
    "Tides rise and fall because the Moon's gravity pulls on the oceans more strongly on the side "
    "of the Earth that faces it. A second bulge forms on the far side, where the water is pulled "
    "less than the solid planet beneath it. As the Earth turns, most coasts pass through both "
    "bulges and see two high tides a day. When the Sun and Moon line up, at new and full moon, "
    "their pulls add together and produce especially large spring tides.",
    "From the first of next month, the bakery on the corner will open at seven instead of six on "
    "weekdays. The owners say that very few customers came in before seven, and the extra hour "
    "lets them bake a second batch of bread for the lunch rush. Saturday hours stay the same, "
    "but the shop will now close on Sundays so that the staff can have a full day off. Orders "
    "for birthday cakes can still be placed by phone at any time.",
    "The first bicycles of the early 1800s had no pedals at all; riders pushed themselves along "
    "with their feet. Pedals fixed to the front wheel came decades later and led to the "
    "penny-farthing, whose huge front wheel made each turn of the pedals cover more ground. "
    "These machines were fast but dangerous, because the rider sat high above the road and "
    "could easily be thrown over the handlebars. The safety bicycle of the 1880s, with two "
    "wheels of equal size and a chain driving the back wheel, soon replaced them.",
    "Researchers have found that sleep plays an active role in forming long-term memories. "
    "During deep sleep, the brain seems to replay patterns of activity from the day, "
    "strengthening some connections and weakening others. In several studies, people who slept "
    "after learning a list of words remembered more of them the next morning than people who "
    "stayed awake for the same time. Staying up all night before an exam may therefore do more "
    "harm than good.",
    "I bought these budget wireless headphones for the gym and have used them almost every day "
    "for three months. The sound is clear, although the bass is weaker than on more expensive "
    "models, and the charge easily lasts a week of workouts. The ear cushions came a little "
    "loose after a few weeks, which was annoying but easy to fix. For the price I would buy "
    "them again, but not for long flights, because they let in a lot of outside noise.",
    "Composting turns kitchen scraps and garden waste into a dark, crumbly soil that plants "
    "love. A good heap needs a mix of green material, such as vegetable peelings and grass "
    "cuttings, and brown material, such as dry leaves, cardboard and straw. It should be kept "
    "about as damp as a wrung-out sponge and turned every week or two so that air reaches the "
    "middle. Meat, dairy and oily food are best left out, because they smell and attract pests.",
    "Glaciers form where more snow falls in winter than melts in summer, so that year after "
    "year the snow is pressed into thick ice. Under its own weight this ice slowly flows "
    "downhill, sometimes only a few centimetres a day. As it moves, it drags rocks frozen into "
    "its base across the ground and grinds the valley floor like coarse sandpaper. When the "
    "glacier retreats, it leaves behind a wide U-shaped valley, quite unlike the narrow V shape "
    "cut by rivers.",
    "Starting in September, employees may work from home on up to three days a week, as long as "
    "their team agrees on which days everyone is in the office. Each team should choose at "
    "least one shared office day so that planning meetings can happen in person. Staff working "
    "from home must be reachable during core hours, from ten in the morning to three in the "
    "afternoon. Laptops and headsets will be provided, but the company will not pay for home "
    "internet.",
    "Mira heard the whimper before she saw the dog. It was hiding under the bench at the bus "
    "stop, a small brown terrier with one ear up and one ear down, shivering in the rain. It "
    "had a red collar but no tag, and it flinched when she held out her hand. She missed her "
    "bus that morning, but by the time the next one came, the dog was asleep inside her coat.",
    "Octopuses are among the most intelligent invertebrates known. In aquariums they have "
    "learned to open screw-top jars, escape through tiny gaps and even recognise keepers they "
    "dislike. Much of an octopus's nervous system sits in its arms, each of which can taste and "
    "feel on its own. Because most species live for only a year or two, scientists still "
    "wonder why such short-lived animals evolved such complex minds.",
    "Before the printing press, books in Europe were copied by hand, which made them rare and "
    "expensive. Around 1450, Johannes Gutenberg combined movable metal type, oil-based ink and "
    "a press adapted from those used for making wine. One workshop could now produce hundreds "
    "of identical copies in the time it once took to copy a single book. Within fifty years, "
    "printing shops had spread to more than two hundred cities.",
    "A year after the city launched its bike-sharing scheme, the council has published the "
    "first results. Riders made about 400,000 trips, most of them shorter than three "
    "kilometres and many between the train station and the university. The busiest hour was "
    "from eight to nine in the morning, when some docking stations near offices were full. The "
    "council plans to add thirty stations next year and to try electric bikes on hilly routes.",
    "Dear tenants, the water supply to the building will be switched off on Thursday from nine "
    "in the morning until about two in the afternoon while plumbers replace the main valve in "
    "the basement. Please fill a few bottles or a kettle beforehand if you will be at home. The "
    "water may look cloudy for a few minutes when it comes back on; this is harmless and clears "
    "if you run the tap. Thank you for your patience.",
    "Coffee begins as the seed of a red fruit, often called a cherry, that grows on shrubs in "
    "tropical highlands. After the harvest, the fruit is removed and the seeds are dried, "
    "either in the sun or after being washed and fermented. The green beans are then shipped "
    "around the world and roasted, which creates their brown colour and most of their flavour. "
    "Light roasts keep more fruity, acidic notes, while dark roasts taste bitter and smoky.",
    "Corals get most of their food from tiny algae that live inside their tissues and give them "
    "their colour. When the water stays too warm for too long, the corals expel these algae "
    "and turn white, which is called bleaching. A bleached coral is not dead, and it can "
    "recover if the water cools within a few weeks. If the heat lasts longer, the coral "
    "starves, and a reef can lose much of its life in a single season.",
    "The public library is changing how it lends e-books. Members can now borrow up to five "
    "e-books at a time instead of three, but each loan lasts fourteen days instead of "
    "twenty-one. Books return automatically at the end of the loan, so there are no late fees. "
    "Popular titles may have a waiting list, and members get an email when a reserved book "
    "becomes available.",
    "Many people believe it is too late to learn a musical instrument as an adult, but the "
    "evidence suggests otherwise. Adults often progress faster than children in the first "
    "months because they understand instructions and can plan their practice. What they lack "
    "is time, so short daily sessions of fifteen minutes tend to work better than one long "
    "session at the weekend. Playing simple pieces with other people also keeps motivation "
    "high.",
    "Noise-cancelling headphones use small microphones to listen to the sound around the "
    "wearer. A chip inside creates a second sound wave that is the mirror image of the noise, "
    "with its peaks where the noise has troughs. When the two waves meet, they largely cancel "
    "each other out. This works best for steady, low sounds like an aircraft engine and much "
    "less well for sudden noises such as voices or a slamming door.",
    "The home side came from behind to win 3-2 in a thrilling match on Saturday afternoon. The "
    "visitors scored twice in the first twenty minutes, the second from a penalty after a "
    "clumsy tackle. Just before half-time, the home captain headed in a corner to make it 2-1, "
    "and the crowd finally found its voice. Two goals in the last ten minutes, the winner a "
    "long shot that went in off the crossbar, completed the comeback.",
    "Every autumn, millions of monarch butterflies fly from Canada and the northern United "
    "States to a few mountain forests in central Mexico, a journey of up to four thousand "
    "kilometres. None of the butterflies that arrive has made the trip before. Scientists "
    "believe they navigate using the position of the Sun together with an internal clock. In "
    "spring they head north again, and it takes several generations to reach the breeding "
    "grounds.",
    "Forty-two volunteers joined last Sunday's beach clean-up and collected sixty-one bags of "
    "rubbish in just under three hours. Plastic bottles and caps were the most common items, "
    "followed by cigarette ends and food wrappers. The group also found a shopping trolley, a "
    "single rubber boot and an old fishing net tangled around the rocks. The next clean-up is "
    "on the last Sunday of the month, and gloves and bags will be provided.",
    "Because of engineering work, there will be no trains between the two stations this "
    "weekend. Replacement buses will run every twenty minutes from the car park in front of "
    "the station, and the journey will take about forty minutes longer than usual. Bicycles "
    "cannot be taken on the buses, except for folding bikes. Tickets already bought for the "
    "weekend are valid on the replacement buses.",
)
