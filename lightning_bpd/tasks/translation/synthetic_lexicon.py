"""English-German lexicon for the synthetic smoke-test corpus in :mod:`.synthetic`: compact data tables, parsed at
import into typed entries (:class:`Noun`, :class:`Adj`, :class:`Verb`, :class:`Adv`). Standard library only.

Noun entries: ``en/en_pl De/De_pl gender [+tag ...] [@letters] [~weak]`` separated by ``;`` (``_`` is a space in
English; an entry without ``/`` is a mass noun without plural). ``@letters`` name the prepositions the noun can
follow (see ``PREPOSITIONS``; defaults per kind in ``DEFAULT_LETTERS``); ``~Form`` is the accusative/dative
singular of a weak masculine noun (``den Jungen``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

NOUN_DATA: dict[str, str] = {
    "per": """man/men Mann/Männer m; woman/women Frau/Frauen f; child/children Kind/Kinder n;
        boy/boys Junge/Jungen m ~Jungen; girl/girls Mädchen/Mädchen n; teacher/teachers Lehrer/Lehrer m;
        doctor/doctors Arzt/Ärzte m; student/students Student/Studenten m ~Studenten; friend/friends Freund/Freunde m;
        neighbour/neighbours Nachbar/Nachbarn m ~Nachbarn; colleague/colleagues Kollege/Kollegen m ~Kollegen;
        baker/bakers Bäcker/Bäcker m; cook/cooks Koch/Köche m; farmer/farmers Bauer/Bauern m ~Bauern;
        driver/drivers Fahrer/Fahrer m; king/kings König/Könige m; queen/queens Königin/Königinnen f;
        sister/sisters Schwester/Schwestern f; brother/brothers Bruder/Brüder m; mother/mothers Mutter/Mütter f;
        father/fathers Vater/Väter m; son/sons Sohn/Söhne m; daughter/daughters Tochter/Töchter f;
        grandmother/grandmothers Großmutter/Großmütter f; grandfather/grandfathers Großvater/Großväter m;
        uncle/uncles Onkel/Onkel m; aunt/aunts Tante/Tanten f; guest/guests Gast/Gäste m;
        tourist/tourists Tourist/Touristen m ~Touristen;
        police_officer/police_officers Polizist/Polizisten m ~Polizisten; soldier/soldiers Soldat/Soldaten m ~Soldaten;
        artist/artists Künstler/Künstler m; painter/painters Maler/Maler m;
        writer/writers Schriftsteller/Schriftsteller m; singer/singers Sänger/Sänger m;
        nurse/nurses Krankenschwester/Krankenschwestern f; customer/customers Kunde/Kunden m ~Kunden;
        pupil/pupils Schüler/Schüler m; baby/babies Baby/Babys n; gardener/gardeners Gärtner/Gärtner m;
        waiter/waiters Kellner/Kellner m; boss/bosses Chef/Chefs m; lawyer/lawyers Anwalt/Anwälte m;
        judge/judges Richter/Richter m; pilot/pilots Pilot/Piloten m ~Piloten;
        engineer/engineers Ingenieur/Ingenieure m; postman/postmen Briefträger/Briefträger m;
        scientist/scientists Wissenschaftler/Wissenschaftler m; actor/actors Schauspieler/Schauspieler m;
        dentist/dentists Zahnarzt/Zahnärzte m""",
    "ani": """dog/dogs Hund/Hunde m; cat/cats Katze/Katzen f; horse/horses Pferd/Pferde n; cow/cows Kuh/Kühe f;
        bird/birds Vogel/Vögel m +fly; fish/fish Fisch/Fische m; mouse/mice Maus/Mäuse f; pig/pigs Schwein/Schweine n;
        sheep/sheep Schaf/Schafe n; goat/goats Ziege/Ziegen f; chicken/chickens Huhn/Hühner n;
        duck/ducks Ente/Enten f +fly; hare/hares Hase/Hasen m ~Hasen; lion/lions Löwe/Löwen m ~Löwen;
        bear/bears Bär/Bären m ~Bären; monkey/monkeys Affe/Affen m ~Affen;
        elephant/elephants Elefant/Elefanten m ~Elefanten; wolf/wolves Wolf/Wölfe m; fox/foxes Fuchs/Füchse m;
        frog/frogs Frosch/Frösche m; snake/snakes Schlange/Schlangen f; owl/owls Eule/Eulen f +fly;
        bee/bees Biene/Bienen f +fly; spider/spiders Spinne/Spinnen f; donkey/donkeys Esel/Esel m""",
    "food": """apple/apples Apfel/Äpfel m; pear/pears Birne/Birnen f; banana/bananas Banane/Bananen f;
        orange/oranges Orange/Orangen f; tomato/tomatoes Tomate/Tomaten f; potato/potatoes Kartoffel/Kartoffeln f;
        egg/eggs Ei/Eier n; cake/cakes Kuchen/Kuchen m +bake; bread Brot n +bake; cheese Käse m;
        soup/soups Suppe/Suppen f; sandwich/sandwiches Sandwich/Sandwiches n; sausage/sausages Wurst/Würste f;
        carrot/carrots Karotte/Karotten f; lemon/lemons Zitrone/Zitronen f; biscuit/biscuits Keks/Kekse m;
        pizza/pizzas Pizza/Pizzas f +bake; rice Reis m; salad/salads Salat/Salate m; cherry/cherries Kirsche/Kirschen f;
        strawberry/strawberries Erdbeere/Erdbeeren f; meat Fleisch n; chocolate Schokolade f; ice_cream Eis n""",
    "drink": """water Wasser n; milk Milch f; coffee Kaffee m; tea Tee m; juice Saft m; wine Wein m; beer Bier n;
        lemonade Limonade f; cocoa Kakao m""",
    "text": """book/books Buch/Bücher n +por +open; newspaper/newspapers Zeitung/Zeitungen f +por;
        letter/letters Brief/Briefe m +por +open +from; magazine/magazines Zeitschrift/Zeitschriften f +por;
        story/stories Geschichte/Geschichten f; message/messages Nachricht/Nachrichten f +from;
        poem/poems Gedicht/Gedichte n; map/maps Karte/Karten f +por;
        postcard/postcards Postkarte/Postkarten f +por +from; novel/novels Roman/Romane m +por;
        dictionary/dictionaries Wörterbuch/Wörterbücher n +por; recipe/recipes Rezept/Rezepte n;
        email/emails E-Mail/E-Mails f +from""",
    "obj": """key/keys Schlüssel/Schlüssel m; bag/bags Tasche/Taschen f +open +cont @t;
        box/boxes Kiste/Kisten f +open +cont @ta; ball/balls Ball/Bälle m +toy +catch; pen/pens Stift/Stifte m;
        cup/cups Tasse/Tassen f +dish; glass/glasses Glas/Gläser n +dish; plate/plates Teller/Teller m +dish;
        bottle/bottles Flasche/Flaschen f +open +cont; knife/knives Messer/Messer n; spoon/spoons Löffel/Löffel m;
        fork/forks Gabel/Gabeln f; umbrella/umbrellas Regenschirm/Regenschirme m +open;
        flower/flowers Blume/Blumen f +plant; stone/stones Stein/Steine m; picture/pictures Bild/Bilder n +hang;
        present/presents Geschenk/Geschenke n +open +from; parcel/parcels Paket/Pakete n +open +from;
        ticket/tickets Fahrkarte/Fahrkarten f; toy/toys Spielzeug/Spielzeuge n +toy;
        phone/phones Telefon/Telefone n +dev; camera/cameras Kamera/Kameras f +dev; watch/watches Uhr/Uhren f;
        ring/rings Ring/Ringe m; basket/baskets Korb/Körbe m +cont @t;
        wallet/wallets Geldbörse/Geldbörsen f +open +cont; suitcase/suitcases Koffer/Koffer m +open +cont @ta;
        candle/candles Kerze/Kerzen f; mirror/mirrors Spiegel/Spiegel m +hang""",
    "clo": """hat/hats Hut/Hüte m; coat/coats Mantel/Mäntel m; shirt/shirts Hemd/Hemden n;
        dress/dresses Kleid/Kleider n; shoe/shoes Schuh/Schuhe m; jacket/jackets Jacke/Jacken f;
        skirt/skirts Rock/Röcke m; scarf/scarves Schal/Schals m; sock/socks Socke/Socken f;
        glove/gloves Handschuh/Handschuhe m""",
    "dev": """lamp/lamps Lampe/Lampen f; radio/radios Radio/Radios n +por; computer/computers Computer/Computer m;
        television/televisions Fernseher/Fernseher m; machine/machines Maschine/Maschinen f; oven/ovens Ofen/Öfen m @t;
        fridge/fridges Kühlschrank/Kühlschränke m +open +cont @t; light/lights Licht/Lichter n""",
    "fur": """table/tables Tisch/Tische m @aunx; chair/chairs Stuhl/Stühle m @ax; bed/beds Bett/Betten n @iux;
        sofa/sofas Sofa/Sofas n @ax; cupboard/cupboards Schrank/Schränke m +open +cont @tax;
        shelf/shelves Regal/Regale n @j; desk/desks Schreibtisch/Schreibtische m @anx;
        bench/benches Bank/Bänke f @ax""",
    "part": """door/doors Tür/Türen f +open @nv; window/windows Fenster/Fenster n +open @nv; wall/walls Wand/Wände f @w;
        roof/roofs Dach/Dächer n @ao""",
    "veh": """car/cars Auto/Autos n +open; bus/buses Bus/Busse m @jxvh; train/trains Zug/Züge m @j;
        bicycle/bicycles Fahrrad/Fahrräder n @ax; boat/boats Boot/Boote n @i; ship/ships Schiff/Schiffe n @a;
        plane/planes Flugzeug/Flugzeuge n +fly @j; lorry/lorries Lastwagen/Lastwagen m; taxi/taxis Taxi/Taxis n;
        tram/trams Straßenbahn/Straßenbahnen f @j""",
    "bld": """house/houses Haus/Häuser n; school/schools Schule/Schulen f; church/churches Kirche/Kirchen f;
        hospital/hospitals Krankenhaus/Krankenhäuser n; station/stations Bahnhof/Bahnhöfe m @inxvhz;
        library/libraries Bibliothek/Bibliotheken f; museum/museums Museum/Museen n;
        restaurant/restaurants Restaurant/Restaurants n; hotel/hotels Hotel/Hotels n;
        shop/shops Geschäft/Geschäfte n +open; bakery/bakeries Bäckerei/Bäckereien f;
        supermarket/supermarkets Supermarkt/Supermärkte m; castle/castles Schloss/Schlösser n;
        tower/towers Turm/Türme m; airport/airports Flughafen/Flughäfen m @inxz; cinema/cinemas Kino/Kinos n""",
    "room": """kitchen/kitchens Küche/Küchen f; room/rooms Zimmer/Zimmer n; office/offices Büro/Büros n;
        bathroom/bathrooms Badezimmer/Badezimmer n; living_room/living_rooms Wohnzimmer/Wohnzimmer n;
        bedroom/bedrooms Schlafzimmer/Schlafzimmer n; classroom/classrooms Klassenzimmer/Klassenzimmer n;
        cellar/cellars Keller/Keller m""",
    "plc": """garden/gardens Garten/Gärten m; park/parks Park/Parks m; city/cities Stadt/Städte f @izdo;
        village/villages Dorf/Dörfer n @izdo; forest/forests Wald/Wälder m @izdo; street/streets Straße/Straßen f @ad;
        market/markets Markt/Märkte m @kz; river/rivers Fluss/Flüsse m @enzo; lake/lakes See/Seen m @enzo;
        sea/seas Meer/Meere n @enzo; mountain/mountains Berg/Berge m @azo; field/fields Feld/Felder n @fdo;
        bridge/bridges Brücke/Brücken f @auzo; farm/farms Bauernhof/Bauernhöfe m @az; zoo/zoos Zoo/Zoos m @iz;
        beach/beaches Strand/Strände m @sz; island/islands Insel/Inseln f @azo; square/squares Platz/Plätze m @az;
        playground/playgrounds Spielplatz/Spielplätze m @az""",
    "plant": """tree/trees Baum/Bäume m @uxf; bush/bushes Busch/Büsche m @hx""",
}

#: Default preposition letters per noun kind (used when an entry has no ``@letters``).
DEFAULT_LETTERS: dict[str, str] = {"per": "xcbzq", "ani": "xcbq", "bld": "ixvhz", "room": "i", "plc": "izd", "veh": "ixvh"}

#: letter -> (German, English, case); several letters share a preposition so that nouns can pick the idiomatic one
#: (i: rooms/buildings/places, e: water, t: containers, j: "im Zug" = "on the train", f: "auf dem Feld" = "in the field").
#: Locative letters take the dative; d/o/b/q the accusative; P: flags of verbs reuse i/a/u/w/t with the accusative.
PREPOSITIONS: dict[str, tuple[str, str, str]] = {
    "i": ("in", "in", "dat"), "e": ("in", "in", "dat"), "t": ("in", "in", "dat"), "j": ("in", "on", "dat"),
    "a": ("auf", "on", "dat"), "k": ("auf", "at", "dat"), "f": ("auf", "in", "dat"), "u": ("unter", "under", "dat"),
    "n": ("an", "at", "dat"), "w": ("an", "on", "dat"), "s": ("an", "on", "dat"), "x": ("neben", "next to", "dat"),
    "v": ("vor", "in front of", "dat"), "h": ("hinter", "behind", "dat"), "d": ("durch", "through", "acc"),
    "z": ("zu", "to", "dat"), "o": ("über", "over", "acc"), "c": ("mit", "with", "dat"), "b": ("für", "for", "acc"),
    "q": ("ohne", "without", "acc"),
}

#: Compound nouns: English modifier, German combining form, heads (English keys). ``school`` + ``book`` -> Schulbuch.
COMPOUNDS: list[tuple[str, str, str]] = [
    ("school", "Schul", "book bag bus garden"), ("kitchen", "Küchen", "table chair window door knife cupboard lamp"),
    ("garden", "Garten", "chair table door house bench"), ("apple", "Apfel", "juice cake tree"),
    ("house", "Haus", "door key cat"), ("car", "Auto", "key door window radio"),
    ("city", "Stadt", "park bus museum library"), ("wine", "Wein", "glass bottle"), ("water", "Wasser", "glass bottle"),
    ("milk", "Milch", "bottle"), ("coffee", "Kaffee", "cup machine"), ("tea", "Tee", "cup"),
    ("beer", "Bier", "glass bottle"), ("orange", "Orangen", "juice"), ("tomato", "Tomaten", "soup salad"),
    ("potato", "Kartoffel", "soup salad"), ("chicken", "Hühner", "egg soup"), ("cheese", "Käse", "cake sandwich"),
    ("cherry", "Kirsch", "cake tree"), ("fish", "Fisch", "soup market restaurant"),
    ("village", "Dorf", "school church street"), ("forest", "Wald", "lake"), ("hotel", "Hotel", "room"),
    ("bus", "Bus", "driver station ticket"), ("taxi", "Taxi", "driver"),
    ("office", "Büro", "chair lamp computer"), ("flower", "Blumen", "shop garden"), ("shoe", "Schuh", "shop"),
    ("winter", "Winter", "coat jacket shoe"), ("summer", "Sommer", "dress hat"), ("dog", "Hunde", "bed"),
]

#: Adjectives: ``en de[/attributive stem] order spec``; order sorts stacked adjectives (opinion, size, age, colour).
ADJECTIVE_DATA = """good gut 0 all; bad schlecht 0 thg; beautiful schön 0 all; ugly hässlich 0 all; nice nett 0 per;
    friendly freundlich 0 liv; clever klug 0 liv; stupid dumm 0 liv; funny lustig 0 liv+text;
    boring langweilig 0 per+text+plc; interesting interessant 0 per+text+bld+plc; famous berühmt 0 per+bld+plc+text;
    strange seltsam 0 all; expensive teuer/teur 0 por+veh+dev+fur+bld+food+drink;
    cheap billig 0 por+veh+dev+fur+food+drink; happy glücklich 0 liv; sad traurig 0 liv+text; tired müde 0 liv;
    hungry hungrig 0 liv; angry wütend 0 liv; brave mutig 0 liv; lazy faul 0 liv; polite höflich 0 per;
    rich reich 0 per; poor arm 0 per; sick krank 0 liv; dangerous gefährlich 0 ani+plc+veh;
    quiet ruhig 0 liv+plc+room+bld; loud laut 0 liv+dev+veh; fast schnell 0 ani+veh; slow langsam 0 ani+veh;
    clean sauber 0 room+bld+veh+clo+fur+dish+plc+part; dirty schmutzig 0 room+bld+veh+clo+fur+dish+plc+part;
    empty leer 0 cont+room+bld+veh+dish; full voll 0 cont+room+bld+veh+dish; dark dunkel/dunkl 0 room+bld+plc;
    bright hell 0 room+dev; warm warm 0 food+drink+clo+room; cold kalt 0 food+drink+room; hot heiß 0 food+drink;
    fresh frisch 0 food+drink; sweet süß 0 food+drink; delicious lecker 0 food+drink; soft weich 0 fur+clo;
    heavy schwer 0 por+fur; light leicht 0 por; big groß 1 all; small klein 1 all; tall hoch/hoh 1 bld+plant;
    long lang 1 text+train+street+river+bridge+scarf+dress+skirt+coat;
    short kurz 1 text+street+river+bridge+dress+skirt+coat; wide breit 1 street+river+bridge+bed;
    narrow schmal 1 street+river+bridge+bed; thin dünn 1 liv; fat dick 1 liv; old alt 2 all;
    new neu 2 por+veh+dev+fur+bld+room+clo+text+part; young jung 2 liv; red rot 3 col; blue blau 3 col;
    green grün 3 col; yellow gelb 3 col; black schwarz 3 col+ani; white weiß 3 col+ani; brown braun 3 col+ani;
    grey grau 3 col+ani"""

#: Verbs: (English base[/3sg], German [prefix|]infinitive[/3sg], subject spec, object, flags).
#: Object: "" (intransitive), "acc:SPEC", "dat:SPEC", "PREP+CASE:SPEC" (prepositional object) or "that" (dass-clause).
#: Flags: L:letters (locative PP), M:letters (direction), P:letters (obligatory directional accusative PP),
#: C (with/without), B (for), D (ditransitive: dative recipient), R (locative PP required), Q (modal: no frequency
#: adverb), N (allows "kein"/"no" objects), S (stative: no manner adverb).
VERB_DATA: list[tuple[str, str, str, str, str]] = [
    ("see", "sehen/sieht", "liv", "acc:all", "L:ixn N"), ("read", "lesen/liest", "per", "acc:text", "L:iafsj"),
    ("buy", "kaufen", "per", "acc:por+veh", "B D L:ik"), ("sell", "verkaufen", "per", "acc:por+veh", "D L:k"),
    ("eat", "essen/isst", "liv", "acc:food", "L:inks"), ("drink", "trinken", "liv", "acc:drink", "L:inks"),
    ("find", "finden", "liv", "acc:por+per+ani", "L:iauxft N"), ("look for", "suchen", "liv", "acc:por+per+ani", "L:iat"),
    ("need", "brauchen", "per", "acc:por+veh+food+drink", "N S"),
    ("would like/would like", "möchten/möchte", "per", "acc:por+veh+food+drink", "Q S"),
    ("have/has", "haben/hat", "per", "acc:por+ani+veh+bld", "N S"), ("like", "mögen/mag", "liv", "acc:all", "S"),
    ("love", "lieben", "per", "acc:per+ani+food+drink+plc", "S"), ("visit", "besuchen", "per", "acc:per+bld+plc", ""),
    ("meet", "treffen/trifft", "per", "acc:per", "L:inxvk"), ("write", "schreiben", "per", "acc:text", "B D L:ia"),
    ("open", "öffnen", "per", "acc:open", ""), ("close", "schließen", "per", "acc:open", ""),
    ("wash", "waschen/wäscht", "per", "acc:per+ani+veh+clo+dish", "L:i"),
    ("carry", "tragen/trägt", "liv", "acc:por", "M:dz"), ("bring", "bringen", "per", "acc:por+food+drink", "D M:z"),
    ("take", "nehmen/nimmt", "per", "acc:por", ""), ("hold", "halten/hält", "per", "acc:por+ani", ""),
    ("build", "bauen", "per", "acc:bld+fur", "B"), ("paint", "malen", "per", "acc:all", "B L:i"),
    ("know", "kennen", "per", "acc:per+ani+bld+plc+text", "S"), ("ask", "fragen", "per", "acc:per", ""),
    ("call", "an|rufen", "per", "acc:per", "L:i"), ("pick up", "ab|holen", "per", "acc:per+por", "L:nk"),
    ("tidy up", "auf|räumen", "per", "acc:room+cupboard+desk", ""), ("switch on", "ein|schalten", "per", "acc:dev", ""),
    ("switch off", "aus|schalten", "per", "acc:dev", ""), ("invite", "ein|laden/lädt", "per", "acc:per", ""),
    ("describe", "beschreiben", "per", "acc:all", ""), ("understand", "verstehen", "per", "acc:per+text", "S"),
    ("forget", "vergessen/vergisst", "per", "acc:por+per", "L:i"),
    ("repair", "reparieren", "per", "acc:dev+veh+fur+part", "B"), ("cook", "kochen", "per", "acc:food", "B D L:i"),
    ("bake", "backen/backt", "per", "acc:bake", "B D L:i"), ("order", "bestellen", "per", "acc:food+drink", "L:i"),
    ("catch", "fangen/fängt", "liv", "acc:ani+catch", ""), ("feed", "füttern", "per", "acc:ani", "L:iak"),
    ("throw", "werfen/wirft", "per", "acc:ball+stone+key", ""), ("lose", "verlieren", "per", "acc:por", "L:iakt"),
    ("show", "zeigen", "per", "acc:por+text", "D"), ("give", "geben/gibt", "per", "acc:por+food+drink", "D"),
    ("send", "schicken", "per", "acc:text+por", "D"), ("clean", "putzen", "per", "acc:room+veh+part+fur+clo", ""),
    ("hear", "hören", "liv", "acc:per+ani+dev", ""), ("look at", "an|schauen", "per", "acc:all", ""),
    ("water", "gießen", "per", "acc:plant", ""),
    ("drive", "fahren/fährt", "per", "acc:car+bus+lorry+taxi+tram", "M:dz"),
    ("teach", "unterrichten", "per", "acc:per", "L:i"), ("wake up", "wecken", "liv", "acc:per+ani", ""),
    ("kiss", "küssen", "per", "acc:per+ani", ""), ("hug", "umarmen", "per", "acc:per+ani", ""),
    ("photograph", "fotografieren", "per", "acc:all", "L:i"), ("rent", "mieten", "per", "acc:veh+bld+room", ""),
    ("wear", "tragen/trägt", "per", "acc:clo", ""), ("count", "zählen", "per", "acc:ani+por", ""),
    ("fill", "füllen", "per", "acc:cont+dish", ""), ("empty", "leeren", "per", "acc:cont+dish", ""),
    ("plant", "pflanzen", "per", "acc:plant", "L:i"), ("help", "helfen/hilft", "liv", "dat:per+ani", "L:ik"),
    ("thank", "danken", "per", "dat:per", ""), ("follow", "folgen", "liv", "dat:per+ani+veh", "M:d"),
    ("answer", "antworten", "per", "dat:per", ""), ("belong to", "gehören", "por+ani+veh+bld", "dat:per", "S"),
    ("trust", "vertrauen", "per", "dat:per+ani", "S"), ("listen to", "zu|hören", "per", "dat:per+dev", ""),
    ("wait for", "warten", "liv", "auf+acc:per+ani+veh", "L:nvx"), ("think of", "denken", "per", "an+acc:all", ""),
    ("talk to", "sprechen/spricht", "per", "mit+dat:per", "L:i"),
    ("play with", "spielen", "liv", "mit+dat:per+ani+toy", "L:iaf"), ("dream of", "träumen", "per", "von+dat:all", ""),
    ("laugh at", "lachen", "per", "über+acc:per+ani", ""), ("look after", "auf|passen", "per", "auf+acc:per+ani", ""),
    ("ask about", "fragen", "per", "nach+dat:per+ani+por", ""), ("put", "legen", "per", "acc:por", "P:iaut"),
    ("place", "stellen", "per", "acc:por+fur", "P:iaut"), ("hang", "hängen", "per", "acc:clo+hang", "P:wit"),
    ("sleep", "schlafen/schläft", "liv", "", "L:iauxf"), ("run", "laufen/läuft", "liv", "", "M:dz L:is"),
    ("walk", "gehen/geht", "per+ani", "", "M:dz"), ("travel", "fahren/fährt", "per+veh", "", "M:dzo"),
    ("swim", "schwimmen", "liv", "", "M:z L:e"), ("fly", "fliegen", "fly", "", "M:oz"),
    ("work", "arbeiten", "per", "", "L:inkf C"), ("play", "spielen", "liv", "", "L:iaufs"),
    ("wait", "warten", "liv", "", "L:nvxj"), ("laugh", "lachen", "per", "", "C"), ("cry", "weinen", "per", "", "L:iax"),
    ("sing", "singen", "per+bird", "", "L:ifk C"), ("dance", "tanzen", "per", "", "L:isk C"),
    ("sit", "sitzen", "liv", "", "R L:iauxnvhfj"),
    ("stand", "stehen/steht", "per+ani+fur+veh+bld+por", "", "R S L:xvhnajt"),
    ("lie", "liegen", "per+ani+por", "", "R S L:iauxjt"), ("live", "wohnen", "per+ani", "", "R S L:ixvhf"),
    ("hang", "hängen", "clo+hang", "", "R S L:wit"), ("smile", "lächeln", "per", "", ""),
    ("shout", "rufen", "per", "", "L:i"), ("jump", "springen", "liv", "", "L:iaf"),
    ("get up", "auf|stehen/steht", "per", "", ""), ("wake up", "auf|wachen", "liv", "", "L:i"),
    ("fall asleep", "ein|schlafen/schläft", "liv", "", "L:iaf"), ("arrive", "an|kommen/kommt", "per+veh", "", "L:in"),
    ("come back", "zurück|kommen/kommt", "per+ani", "", "M:z"), ("leave", "weg|gehen/geht", "per+ani", "", ""),
    ("go shopping", "ein|kaufen", "per", "", "L:ik"), ("watch TV", "fern|sehen/sieht", "per", "", "L:ia"),
    ("get in", "ein|steigen", "per", "", ""), ("get out", "aus|steigen", "per", "", ""),
    ("go out", "aus|gehen/geht", "per", "", ""), ("cook", "kochen", "per", "", "L:i C"),
    ("read", "lesen/liest", "per", "", "L:iafsj"), ("eat", "essen/isst", "liv", "", "L:inks C"),
    ("bark", "bellen", "dog+fox", "", "L:iax"), ("tidy up", "auf|räumen", "per", "", "L:i"),
    ("study", "lernen", "per", "", "L:i C"), ("ride", "reiten", "per", "", "M:dz"),
    ("climb", "klettern", "per+ani", "", "L:f"), ("know", "wissen/weiß", "per", "that", ""),
    ("believe", "glauben", "per", "that", ""), ("say", "sagen", "per", "that", ""),
    ("hope", "hoffen", "per", "that", ""), ("think", "denken", "per", "that", ""),
    ("notice", "bemerken", "per", "that", ""), ("hear", "hören", "per", "that", ""),
    ("see", "sehen/sieht", "per", "that", ""), ("forget", "vergessen/vergisst", "per", "that", ""),
    ("dream", "träumen", "per", "that", ""),
]

#: Adverbs: (English, German, kind) with kind t = time (frontable; English at the front or end), f = frequency
#: (frontable in German; English before the verb), m = manner, p = place.
ADVERB_DATA: list[tuple[str, str, str]] = [
    ("today", "heute", "t"), ("tomorrow", "morgen", "t"), ("now", "jetzt", "t"), ("soon", "bald", "t"),
    ("later", "später", "t"), ("in the morning", "morgens", "t"), ("in the evening", "abends", "t"),
    ("at night", "nachts", "t"), ("at noon", "mittags", "t"), ("in the afternoon", "nachmittags", "t"),
    ("on Mondays", "montags", "t"), ("on Tuesdays", "dienstags", "t"), ("on Wednesdays", "mittwochs", "t"),
    ("on Thursdays", "donnerstags", "t"), ("on Fridays", "freitags", "t"), ("on Saturdays", "samstags", "t"),
    ("on Sundays", "sonntags", "t"), ("often", "oft", "f"), ("sometimes", "manchmal", "f"), ("always", "immer", "f"),
    ("usually", "meistens", "f"), ("rarely", "selten", "f"), ("quickly", "schnell", "m"), ("slowly", "langsam", "m"),
    ("carefully", "vorsichtig", "m"), ("quietly", "leise", "m"), ("loudly", "laut", "m"), ("happily", "fröhlich", "m"),
    ("calmly", "ruhig", "m"), ("patiently", "geduldig", "m"), ("here", "hier", "p"), ("there", "dort", "p"),
]

#: Subordinating conjunctions (verb-final clauses) and coordinating conjunctions (English, German).
SUBORDINATORS: list[tuple[str, str]] = [
    ("because", "weil"), ("that", "dass"), ("when", "wenn"), ("although", "obwohl"), ("while", "während"), ("before", "bevor"),
]
COORDINATORS: list[tuple[str, str]] = [("and", "und"), ("but", "aber")]

# ---------------------------------------------------------------- parsed, typed lexicon
KINDS = tuple(NOUN_DATA)
_GROUPS = {"liv": {"per", "ani"}, "thg": set(KINDS) - {"per", "ani"}, "all": set(KINDS),
           "col": {"obj", "clo", "veh", "fur", "bld", "dev", "plant", "part"}}


@dataclass(frozen=True)
class Noun:
    """A noun with English and German singular/plural forms, German gender, semantic tags and preposition letters."""

    key: str
    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str
    tags: frozenset[str]
    letters: str = ""
    weak: str = ""
    mass: bool = False

    def de_form(self, plural: bool, case: str) -> str:
        """German form in a number and case (dative plural -n, weak masculine -(e)n)."""
        if plural:
            return self.de_pl + ("" if case != "dat" or self.de_pl.endswith(("n", "s")) else "n")
        return self.weak if self.weak and case != "nom" else self.de


@dataclass(frozen=True)
class Adj:
    """An adjective: English, German predicative form, German attributive stem, stacking order, allowed nouns."""

    en: str
    de: str
    stem: str
    order: int
    spec: frozenset[str]


@dataclass(frozen=True)
class Verb:
    """A verb entry; German finite forms are 3rd person (the only person the grammar uses)."""

    en: str
    en3: str
    inf: str
    de3: str
    de3pl: str
    prefix: str
    subj: frozenset[str]
    obj_case: str = ""  # "", "acc", "dat", "that"
    obj_prep: str = ""  # German preposition of a prepositional object
    obj: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    letters: dict[str, str] = field(default_factory=dict, compare=False, hash=False)  # "L"/"M"/"P" -> letters

    def de_finite(self, plural: bool, joined: bool = False) -> str:
        """Finite German form; ``joined`` re-attaches a separable prefix (verb-final clauses)."""
        form = self.de3pl if plural else self.de3
        return self.prefix + form if joined else form


@dataclass(frozen=True)
class Adv:
    """An adverb; kind t (time), f (frequency), m (manner) or p (place)."""

    en: str
    de: str
    kind: str


def parse_spec(text: str) -> frozenset[str]:
    """Set of noun kinds/tags/keys named by a "+"-joined spec, with groups (liv, thg, col, all) expanded."""
    out: set[str] = set()
    for tok in text.split("+"):
        out |= _GROUPS.get(tok, {tok.replace("_", " ")})
    return frozenset(out)


def en_3sg(verb: str) -> str:
    """English 3rd person singular present of a (possibly multi-word) verb: watch TV -> watches TV."""
    head, _, rest = verb.partition(" ")
    if head.endswith(("s", "sh", "ch", "x", "z", "o")):
        head += "es"
    elif head.endswith("y") and head[-2:-1] not in "aeiou":
        head = head[:-1] + "ies"
    else:
        head += "s"
    return f"{head} {rest}".strip()


def _de_3sg(inf: str) -> str:
    stem = inf[:-1] if inf.endswith(("eln", "ern")) else inf[:-2]
    if stem.endswith(("t", "d", "chn", "chm")) or (stem[-1] in "mn" and stem[-2] not in "aeiouäöülrmnh"):
        return stem + "et"
    return stem + "t"


def _parse_nouns() -> dict[str, Noun]:
    nouns: dict[str, Noun] = {}
    for kind, block in NOUN_DATA.items():
        for entry in block.split(";"):
            en, de, gender, *extra = entry.split()
            tags = {kind, "por"} if kind in ("obj", "clo", "food") else {kind}
            letters, weak = DEFAULT_LETTERS.get(kind, ""), ""
            for tok in extra:
                if tok[0] == "+":
                    tags.add(tok[1:])
                elif tok[0] == "@":
                    letters = tok[1:]
                else:
                    weak = tok[1:]
            en_sg, _, en_pl = en.replace("_", " ").partition("/")
            de_sg, _, de_pl = de.partition("/")
            assert gender in "mfn" and en_sg not in nouns, entry
            nouns[en_sg] = Noun(en_sg, en_sg, en_pl or en_sg, de_sg, de_pl or de_sg, gender, frozenset(tags | {en_sg}),
                                letters, weak, mass=not en_pl)
    return nouns


NOUNS: dict[str, Noun] = _parse_nouns()
BASE_NOUN_COUNT = len(NOUNS)
_COMPOUND_FORMS = {mod: form for mod, form, _ in COMPOUNDS}


def make_compound(modifier: str, head: str) -> Noun:
    """Compound noun from an English modifier and head key: school + book -> Schulbuch (gender of the head)."""
    h, form = NOUNS[head], _COMPOUND_FORMS[modifier]
    key = f"{modifier} {h.en}"
    return Noun(key, key, f"{modifier} {h.en_pl}", form + h.de.lower(), form + h.de_pl.lower(), h.gender,
                h.tags | {key, "compound"}, h.letters, form + h.weak.lower() if h.weak else "", h.mass)


COMPOUND_NOUNS: dict[str, Noun] = {
    c.key: c for mod, _, heads in COMPOUNDS for c in (make_compound(mod, h) for h in heads.split())
}
NOUNS.update(COMPOUND_NOUNS)


def _parse_adjs() -> dict[str, Adj]:
    out = {}
    for entry in ADJECTIVE_DATA.split(";"):
        en, de, order, allowed = entry.split()
        pred, _, stem = de.partition("/")
        out[en] = Adj(en, pred, stem or pred.removesuffix("e"), int(order), parse_spec(allowed))
    return out


def _parse_verb(en: str, de: str, subj: str, obj: str, flags: str) -> Verb:
    en_base, _, en3 = en.partition("/")
    inf, _, de3 = de.partition("/")
    prefix, _, base = inf.rpartition("|")
    case, _, obj_spec = obj.partition(":")
    prep, _, case = case.rpartition("+")
    letters = {f[0]: f[2:] for f in flags.split() if ":" in f}
    return Verb(en_base, en3 or en_3sg(en_base), prefix + base, de3 or _de_3sg(base), base, prefix, parse_spec(subj), case,
                prep, parse_spec(obj_spec) if obj_spec else frozenset(), frozenset(f[0] for f in flags.split()), letters)


ADJECTIVES: dict[str, Adj] = _parse_adjs()
VERBS: list[Verb] = [_parse_verb(*v) for v in VERB_DATA]
ADVERBS: list[Adv] = [Adv(*a) for a in ADVERB_DATA]
VERB_BY_DE: dict[str, Verb] = {v.inf: v for v in reversed(VERBS)}  # first entry wins (transitive before intransitive)
FINITE_FORMS = frozenset({f for v in VERBS for f in (v.de3, v.de3pl)} | {"ist", "sind"})
FINITE_FORMS_SUB = frozenset({v.de_finite(p, joined=True) for v in VERBS for p in (False, True)} | {"ist", "sind"})
FRONTABLE_ADVERBS = frozenset(a.de for a in ADVERBS if a.kind in "tf")
_PREP_PAIRS = {p[:2] for p in PREPOSITIONS.values()} | {(v.obj_prep, v.en.split()[-1]) for v in VERBS if v.obj_prep}
LEXICON_SIZE: int = (BASE_NOUN_COUNT + len({(v.en, v.inf) for v in VERBS}) + len(ADJECTIVES) + len(ADVERBS)
                     + len(_PREP_PAIRS) + len(SUBORDINATORS) + len(COORDINATORS))
